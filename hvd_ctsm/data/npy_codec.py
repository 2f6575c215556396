"""A faster decoder for Petastorm's ndarray cells, byte-compatible with its NdarrayCodec.

Petastorm's NdarrayCodec stores each array as the bytes of `np.save` and decodes them with
`np.load`, which parses the .npy header with `ast.literal_eval` on every call: profiled on our
training rows (11 arrays a row), that was three quarters of the time spent reading a shard. The
header of an array depends only on its dtype and shape, and a dataset has few distinct ones, so
`NpyCodec` parses each distinct header once and then wraps the payload with `np.frombuffer`.

Datasets keep Petastorm's own NdarrayCodec in their stored schema, so any Petastorm reader reads
them (Petastorm also refuses to unpickle codec classes from other packages). Our reader switches
the codecs of the schema it loaded to this subclass, in this process only: same bytes, same arrays.
"""

from __future__ import annotations

import ast
from functools import cache
from io import BytesIO

import numpy as np

MAGIC = b"\x93NUMPY"
_MAX_CACHED_HEADERS = 100_000  # a bound, not a tuning knob: one entry per distinct dtype+shape
_headers: dict[bytes, tuple[np.dtype, tuple[int, ...], bool]] = {}


def _parse_header(header: bytes) -> tuple[np.dtype, tuple[int, ...], bool]:
    parsed = _headers.get(header)
    if parsed is None:
        fields = ast.literal_eval(header.decode("latin1"))
        parsed = (np.dtype(fields["descr"]), tuple(fields["shape"]), bool(fields["fortran_order"]))
        if len(_headers) < _MAX_CACHED_HEADERS:
            _headers[header] = parsed
    return parsed


def decode_npy(value) -> np.ndarray:
    """The array in .npy bytes (format 1.0 to 3.0), as np.load would return it, but writable."""
    buf = memoryview(value)
    major = buf[6] if len(buf) > 9 and buf[:6] == MAGIC else 0
    if major not in (1, 2, 3):
        return np.load(BytesIO(bytes(buf)), allow_pickle=False)  # let numpy explain the error
    width = 2 if major == 1 else 4
    start = 8 + width
    length = int.from_bytes(buf[8:start], "little")
    dtype, shape, fortran = _parse_header(bytes(buf[start:start + length]))
    if dtype.hasobject:
        raise ValueError("object arrays are not allowed in a dataset (they would need pickle)")
    count = int(np.prod(shape, dtype=np.int64))
    array = np.frombuffer(buf, dtype=dtype, count=count, offset=start + length)
    return array.reshape(shape, order="F" if fortran else "C").copy()


@cache
def npy_codec_classes():
    """NdarrayCodec (np.save bytes) with a decoder that parses each distinct header once. Built
    on first use: this module is also the Petastorm-free reader's decoder."""
    from petastorm.codecs import NdarrayCodec

    class NpyCodec(NdarrayCodec):
        def decode(self, unischema_field, value):
            return decode_npy(value)

    return NdarrayCodec, NpyCodec


def use_fast_decoding(schema) -> int:
    """Switch a loaded Unischema's NdarrayCodec fields to NpyCodec (in place); returns how many.

    Called on a reader's schema right after make_reader and before the first row: Petastorm's
    in-process ("dummy") worker decodes with these very codec objects.
    """
    ndarray_codec, npy_codec = npy_codec_classes()
    switched = 0
    for field in schema.fields.values():
        if type(field.codec) is ndarray_codec:
            field.codec.__class__ = npy_codec
            switched += 1
    return switched
