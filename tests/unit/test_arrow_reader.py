"""The Petastorm-free reader gives exactly Petastorm's rows, in Petastorm's order: shuffled and
not, sharded over 1 to 3 ranks, every split, all fields and a subset; and the trainer's batches
are the same under either reader.
This file holds the unit-tier part; the rest is in tests/integration/test_arrow_reader.py."""

from __future__ import annotations

import pytest

from hvd_ctsm.data.arrow_reader import shard_order
from hvd_ctsm.data.batches import DatasetError, reader_name


def test_shard_order_keeps_each_rank_to_its_own_row_groups():
    """Shuffling changes the order, never which rank reads a row group."""
    for size in (1, 2, 3):
        for seed, shuffle in ((None, False), (3, True), (3, False)):
            orders = [shard_order(10, r, size, seed, shuffle) for r in range(size)]
            assert sorted(sum(orders, [])) == list(range(10))
            assert all(i % size == r for r, order in enumerate(orders) for i in order)
    assert shard_order(10, 0, 1, 3, True) != list(range(10))


def test_an_unknown_reader_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("HVD_CTSM_READER", "parquet")
    with pytest.raises(DatasetError, match="use arrow"):
        reader_name()
