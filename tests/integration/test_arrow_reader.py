"""The Petastorm-free reader gives exactly Petastorm's rows, in Petastorm's order: shuffled and
not, sharded over 1 to 3 ranks, every split, all fields and a subset; and the trainer's batches
are the same under either reader. The unit-tier part is in tests/unit/test_arrow_reader.py."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from hvd_ctsm.data.batches import DatasetError, open_reader, plan_epoch, split_url, train_batches
from tests.helpers import faultlib as fl

pytestmark = pytest.mark.petastorm


def read_all(monkeypatch, reader: str, url: str, rank: int, size: int, seed, shuffle, fields=None):
    monkeypatch.setenv("HVD_CTSM_READER", reader)
    with open_reader(url, rank, size, seed=seed, shuffle=shuffle, fields=fields) as rows:
        return [row._asdict() for row in rows]


def assert_same_rows(got: list[dict], want: list[dict]):
    assert len(got) == len(want) > 0
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            if isinstance(b[name], np.ndarray):
                assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
                np.testing.assert_array_equal(a[name], b[name])
            else:
                assert type(a[name]) is type(b[name]) and a[name] == b[name], name


@pytest.mark.parametrize("split", ["train", "validation", "serving"])
@pytest.mark.parametrize("size,seed,shuffle", [(1, None, False), (2, None, False),
                                               (2, 7, True), (3, 100_004, True)])
def test_rows_equal_petastorm_rows(monkeypatch, tiny_features, split, size, seed, shuffle):
    url = split_url(tiny_features, split)
    for rank in range(size):
        want = read_all(monkeypatch, "petastorm", url, rank, size, seed, shuffle)
        got = read_all(monkeypatch, "arrow", url, rank, size, seed, shuffle)
        assert_same_rows(got, want)


def test_a_field_subset_reads_only_those_fields(monkeypatch, tiny_features):
    url = split_url(tiny_features, "train")
    want = read_all(monkeypatch, "petastorm", url, 1, 2, None, False, ["target_pos"])
    got = read_all(monkeypatch, "arrow", url, 1, 2, None, False, ["target_pos"])
    assert_same_rows(got, want)
    assert list(got[0]) == ["target_pos"]


def test_training_batches_are_equal_under_both_readers(monkeypatch, tiny_features):
    url = split_url(tiny_features, "train")
    plan = plan_epoch(url, 2, 8)
    batches = {}
    for reader in ("petastorm", "arrow"):
        monkeypatch.setenv("HVD_CTSM_READER", reader)
        batches[reader] = list(train_batches(url, 1, 2, epoch=3, plan=plan, batch_size=8,
                                             max_len=40, seed=5))
    assert len(batches["arrow"]) == plan.steps
    for a, b in zip(batches["arrow"], batches["petastorm"], strict=True):
        assert a.keys() == b.keys()
        for name in a:
            assert torch_equal(a[name], b[name]), name


def torch_equal(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())


@pytest.mark.parametrize("reader", ["arrow", "petastorm"])
def test_a_damaged_page_is_one_line_under_either_reader(monkeypatch, tiny_features, tmp_path,
                                                        reader):
    """A file's pages damaged, its size and footer as they were. Before, under
    HVD_CTSM_READER=petastorm training crashed (exit 3) with pyarrow's `OSError: Couldn't
    deserialize thrift ...`, then said only the split and the rank; the default reader already
    said the file's line, and now both do (Petastorm's by reading the shard again)."""
    data = tmp_path / "tiny"
    shutil.copytree(tiny_features, data)
    fl.damage_pages(data / "train" / "part-00000.parquet")
    with pytest.raises(DatasetError, match=r"/train/part-00000\.parquet: row group 0 cannot be "
                       r"read \(.+\): the file is damaged; rebuild the features"):
        read_all(monkeypatch, reader, split_url(data, "train"), 0, 1, None, False)
