"""The fast .npy decoder returns exactly what np.load returns, for any array a dataset can hold."""

from __future__ import annotations

from io import BytesIO

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from hvd_ctsm.data.npy_codec import decode_npy, npy_codec_classes

DTYPES = st.sampled_from([np.int32, np.int64, np.float32, np.float64, np.uint8, ">i4", "<f8"])


def npy_bytes(array: np.ndarray, version=None) -> bytes:
    memfile = BytesIO()
    np.lib.format.write_array(memfile, array, version=version, allow_pickle=False)
    return memfile.getvalue()


@settings(max_examples=200, deadline=None)
@given(array=hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0,
                                                max_side=5)),
       version=st.sampled_from([None, (1, 0), (2, 0), (3, 0)]),
       fortran=st.booleans())
def test_decode_matches_np_load(array, version, fortran):
    if fortran:
        array = np.asfortranarray(array)
    raw = npy_bytes(array, version)
    want = np.load(BytesIO(raw))
    got = decode_npy(raw)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert got.flags.writeable


def test_codec_round_trip_through_petastorm_encode():
    """Encoded by Petastorm's own NdarrayCodec.encode (what the feature job writes)."""
    pytest.importorskip("petastorm", reason="Petastorm's codec (classic stack)")
    from petastorm.unischema import UnischemaField

    codec = npy_codec_classes()[1]()
    field = UnischemaField("x", np.int32, (None, None), codec, False)
    array = np.arange(12, dtype=np.int32).reshape(4, 3)
    np.testing.assert_array_equal(codec.decode(field, codec.encode(field, array)), array)


def test_object_arrays_and_garbage_are_refused():
    memfile = BytesIO()
    np.lib.format.write_array(memfile, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="object arrays"):
        decode_npy(memfile.getvalue())
    with pytest.raises(ValueError):
        decode_npy(b"\x93NU")  # truncated: not an .npy at all
