"""Elastic training: workers may die or join mid-epoch; no batch is trained twice or skipped.

    horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script ./hosts.sh \\
        --network-interface lo --gloo python -m hvd_ctsm.train --elastic --data DIR --out RUN

The data plan does not depend on the world size. Each epoch has one fixed global order of the
training rows, decided by (seed, epoch) alone: row groups in a seeded permutation, rows within each
group seeded too. `rows` (a position in that order) is all a worker needs: a global step takes the
next size x batch_size rows and rank r trains on the r-th slice. The position is part of the elastic
state (hvd.elastic.TorchState, with the model, the optimizer, the epoch, the step and the samples
seen), committed every `commit_every_steps` steps and at each epoch end. When a worker dies, the
survivors go back to the last commit and split the rest of the same order over the new size; a
worker that joins receives the committed state from rank 0 and takes its slice from there. Rows
that do not fill a last global batch are left out of that epoch (as the fixed plan does).

The learning-rate schedule follows samples seen, in units of the global batch the job started
with, so it does not depend on the size; the peak lr is rescaled (optim.lr_scaling) for the
current effective batch after every change of size.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from hvd_ctsm import distributed as dist
from hvd_ctsm.data.arrow_reader import (RowGroup, read_row_group,  # noqa: F401  (re-exported)
                                        row_groups)
from hvd_ctsm.data.batches import DatasetError, collate
from hvd_ctsm.train import faults

log = logging.getLogger("hvd_ctsm.train.elastic")


class GlobalOrder:
    """One epoch's fixed order of every training row, the same on every worker of any size."""

    def __init__(self, groups: list[RowGroup], seed: int, epoch: int):
        self.groups = groups
        self.seed, self.epoch = seed, epoch
        self.group_order = np.random.default_rng([seed, epoch, 7]).permutation(len(groups))
        sizes = [groups[g].rows for g in self.group_order]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.total = int(self.starts[-1])

    def steps_left(self, rows: int, size: int, batch_size: int) -> int:
        return (self.total - rows) // (size * batch_size)

    def segments(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """Rows [start, stop) of the order as (row group, first, last+1) within each group."""
        out = []
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        while start < stop:
            group_end = int(self.starts[i + 1])
            end = min(stop, group_end)
            out.append((int(self.group_order[i]), start - int(self.starts[i]),
                        end - int(self.starts[i])))
            start, i = end, i + 1
        return out

    def row_permutation(self, group: int) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch, int(group)]).permutation(
            self.groups[group].rows)


class RowGroupCache:
    """Decoded rows of a few row groups (hvd_ctsm.data.arrow_reader: the rows the other readers
    give)."""

    def __init__(self, url: str, keep: int = 4):
        self.url, self.keep = url, keep
        self._rows: dict[int, list] = {}

    def rows(self, groups: list[RowGroup], g: int) -> list:
        if g not in self._rows:
            self._rows[g] = read_row_group(self.url, groups[g])
            while len(self._rows) > self.keep:
                self._rows.pop(next(iter(self._rows)))
        return self._rows[g]


def rank_slice(order: GlobalOrder, cache: RowGroupCache, rows: int, rank: int, size: int,
               batch_size: int) -> list:
    """This rank's batch of the global step that starts at position `rows`."""
    start = rows + rank * batch_size
    picked = []
    for g, lo, hi in order.segments(start, start + batch_size):
        group_rows, permutation = cache.rows(order.groups, g), order.row_permutation(g)
        picked.extend(group_rows[i] for i in permutation[lo:hi])
    return picked


def epoch_batches(order, cache, rows: int, batch_size: int, max_len: int):
    """(position after the step, this rank's batch) for the rest of the epoch at the current
    size; the size is read once, as a change of size restarts the loop from the last commit."""
    rank, size = dist.rank(), dist.size()
    for _ in range(order.steps_left(rows, size, batch_size)):
        yield rows + size * batch_size, collate(rank_slice(order, cache, rows, rank, size,
                                                           batch_size), max_len)
        rows += size * batch_size


class SampleClock:
    """Samples seen, read by the lr schedule (so the schedule does not depend on the size)."""

    def __init__(self, unit: int):
        self.unit = unit  # rows of one global batch at the size the job started with
        self.samples = 0

    def step(self) -> int:
        return self.samples // self.unit


def announce_size(state, out: Path, started: float) -> None:
    """At every (re)start of the elastic loop: log a change of size and where training resumes."""
    size = dist.size()
    if state.size == size:
        return
    if dist.is_root():
        event = {"event": "world_size_changed", "from_size": state.size, "to_size": size,
                 "epoch": state.epoch, "rows": state.rows, "step": state.step,
                 "seconds_since_start": round(time.time() - started, 2)}
        log.warning("world size %d -> %d: resuming from the last commit at epoch %d, row %d of "
                    "the epoch's global order, step %d", state.size, size, state.epoch,
                    state.rows, state.step)
        faults.append_event(out, event)
    state.size = size


def plan_or_fail(groups: list[RowGroup], batch_size: int, size: int) -> None:
    total = sum(g.rows for g in groups)
    if total < batch_size * size:
        raise DatasetError(f"the training split has {total} rows, less than one global batch "
                           f"of {batch_size} x {size}: lower data.batch_size")


def set_lr_scale(optim_cfg, scheduler, effective_batch: int) -> float:
    from hvd_ctsm.train.support import lr_scale

    scale = lr_scale(optim_cfg, effective_batch)
    scheduler.base_lrs = [optim_cfg.lr * scale for _ in scheduler.base_lrs]
    return scale

