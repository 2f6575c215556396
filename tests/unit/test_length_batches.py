"""Batches grouped by history length (data.balance=length): the pure planner, then the trainer's
reader on a tiny real Petastorm dataset.
This file holds the unit-tier part; the rest is in tests/integration/test_length_batches.py."""

import itertools

import numpy as np

from hvd_ctsm.data.batches import LENGTH_POOL_BATCHES, equal_target_cuts
from tests.helpers.length_rows import BATCH, grouped, shard


def width(batch):
    return max(r.history_len for r in batch)


def test_cuts_split_the_targets_evenly_and_leave_no_run_empty():
    assert equal_target_cuts([1] * 8, 4) == [0, 2, 4, 6, 8]
    assert equal_target_cuts([1, 1, 1, 1, 100], 2) == [0, 4, 5]
    assert equal_target_cuts([100, 1, 1], 3) == [0, 1, 2, 3]  # each run keeps a row
    counts = np.random.default_rng(0).integers(1, 200, 500)
    cuts = equal_target_cuts(sorted(counts), 20)
    sums = [sum(sorted(counts)[a:b]) for a, b in itertools.pairwise(cuts)]
    assert max(sums) - min(sums) <= 2 * counts.max()


def test_every_row_of_the_epoch_once_in_batches_of_alike_length_and_equal_targets():
    lengths = np.random.default_rng(0).integers(1, 201, 1000)
    steps = len(lengths) // BATCH  # 62: a pool of 32 batches, then one of 30
    batches = grouped(lengths, steps)
    assert len(batches) == steps
    # The rows row batches would use, each once (a pool is LENGTH_POOL_BATCHES x BATCH rows).
    assert sorted(r.id for b in batches for r in b) == list(range(steps * BATCH))
    targets = np.array([sum(len(r.target_pos) for r in b) for b in batches[:LENGTH_POOL_BATCHES]])
    assert targets.max() - targets.min() <= 2 * lengths.max()
    assert max(len(b) for b in batches) > 3 * min(len(b) for b in batches)  # short ones: more
    spans = [width(b) - min(r.history_len for r in b) for b in batches]
    assert max(spans) < 100 and np.median(spans) < 20  # random batches span most of 1..200
    padded = sum(len(b) * width(b) for b in batches)
    assert padded < 1.2 * sum(r.history_len for b in batches for r in b)
    assert not np.all(np.diff([width(b) for b in batches[:LENGTH_POOL_BATCHES]]) >= 0)


def test_the_same_inputs_give_the_same_batches():
    lengths = np.random.default_rng(1).integers(1, 201, 300)
    ids = [[r.id for r in b] for b in grouped(lengths, 18)]
    assert ids == [[r.id for r in b] for b in grouped(lengths, 18)]
    assert ids != [[r.id for r in b] for b in grouped(lengths, 18, order_seed=6)]


def test_ranks_take_batches_of_about_the_same_length_at_each_step():
    rng = np.random.default_rng(2)
    rank0, rank1 = (grouped(rng.integers(1, 201, 640), 40) for _ in range(2))
    widths = [np.array([width(b) for b in rank]) for rank in (rank0, rank1)]
    # Different rows, the same order of lengths: step by step the widths follow each other.
    assert np.corrcoef(widths[0], widths[1])[0, 1] > 0.9


def test_a_shard_that_runs_out_yields_fewer_batches():
    assert len(grouped(np.full(40, 7), 3)) == 0  # 40 rows < 3 batches of 16: nothing half-made


def test_micro_batches_keep_every_row_of_a_batch_whose_rows_do_not_divide():
    from hvd_ctsm.data.batches import collate
    from hvd_ctsm.train.support import split_batch

    rows = shard([3, 4, 5, 6, 7])
    for row in rows:
        n = row.history_len
        row.item, row.event_type = np.arange(1, n + 1), np.ones(n, np.int64)
        row.value, row.log_gap = np.zeros(n, np.float32), np.zeros(n, np.float32)
        row.client_attrs = np.zeros((n, 0), np.int64)
        row.target_item, row.target_label = row.item[1:], np.ones(n - 1, np.float32)
        row.target_pos, row.target_log_dt = np.arange(n - 1), np.zeros(n - 1, np.float32)
    parts = split_batch(collate(rows, 8), 2)
    assert [len(p["item"]) for p in parts] == [2, 3]
    assert sum(len(p["target_item"]) for p in parts) == sum(n - 1 for n in [3, 4, 5, 6, 7])
    assert parts[1]["target_row"].tolist() == [0] * 4 + [1] * 5 + [2] * 6
