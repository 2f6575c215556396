"""Batches balanced by targets (data.balance=targets) on a tiny real Petastorm dataset."""

import numpy as np
import pytest
import torch

from hvd_ctsm.data.batches import plan_epoch, split_url, train_batches

pytestmark = [pytest.mark.spark]
BATCH, SIZE, MAX_LEN = 8, 2, 40


def batches(url, plan, rank, epoch=0, skip=0):
    return list(train_batches(url, rank, SIZE, epoch, plan, BATCH, MAX_LEN, seed=3, skip=skip))


def targets_per_step(url, plan):
    per_rank = [[len(b["target_item"]) for b in batches(url, plan, r)] for r in range(SIZE)]
    assert all(len(steps) == plan.steps for steps in per_rank)  # equal step counts: no hang
    return np.array(per_rank)


def test_every_rank_gets_the_planned_steps_with_about_the_same_targets(tiny_features):
    url = split_url(tiny_features, "train")
    by_rows = plan_epoch(url, SIZE, BATCH)
    balanced = plan_epoch(url, SIZE, BATCH, "targets")
    assert balanced.steps == by_rows.steps and balanced.target_budget > 0
    rows_work = targets_per_step(url, by_rows)
    work = targets_per_step(url, balanced)
    assert (work >= balanced.target_budget).all()
    # Ranks differ by less than one row's targets per step, far less than with row batches.
    gap, rows_gap = np.abs(work[0] - work[1]), np.abs(rows_work[0] - rows_work[1])
    assert gap.max() < MAX_LEN
    assert gap.mean() < rows_gap.mean()


def test_a_resumed_epoch_skips_exactly_the_batches_already_trained(tiny_features):
    url = split_url(tiny_features, "train")
    plan = plan_epoch(url, SIZE, BATCH, "targets")
    whole = batches(url, plan, rank=1, epoch=2)
    tail = batches(url, plan, rank=1, epoch=2, skip=2)
    assert len(tail) == len(whole) - 2
    for a, b in zip(whole[2:], tail, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
