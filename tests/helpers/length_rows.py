"""Rows of given history lengths, as the reader gives them, and the length-grouped batches of
them (data.balance=length)."""

from types import SimpleNamespace

import numpy as np

from hvd_ctsm.data.batches import length_grouped

BATCH = 16


def shard(lengths):
    """Rows as the reader gives them: a training row has a target at most of its positions."""
    return [SimpleNamespace(history_len=int(n), target_pos=np.arange(max(1, n - 1)), id=i)
            for i, n in enumerate(lengths)]


def grouped(lengths, steps, order_seed=5):
    return list(length_grouped(iter(shard(lengths)), steps, BATCH,
                               np.random.default_rng(order_seed)))
