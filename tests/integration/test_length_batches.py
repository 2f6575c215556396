"""Batches grouped by history length (data.balance=length): the pure planner, then the trainer's
reader on a tiny real Petastorm dataset.
The unit-tier part is in tests/unit/test_length_batches.py."""


import pytest
import torch

from hvd_ctsm.data.batches import plan_epoch, split_url, train_batches


@pytest.mark.spark
def test_the_reader_pads_each_batch_to_its_longest_history_and_resumes_exactly(tiny_features):
    url = split_url(tiny_features, "train")
    batch, max_len = 8, 40

    def read(plan, rank, skip=0):
        return list(train_batches(url, rank, 2, 1, plan, batch, max_len, seed=3, skip=skip))

    by_rows, by_length = plan_epoch(url, 2, batch), plan_epoch(url, 2, batch, "length")
    assert by_length.steps == by_rows.steps and by_length.by_length
    for rank in range(2):
        plain, alike = read(by_rows, rank), read(by_length, rank)
        assert len(alike) == by_length.steps
        assert sum(len(b["item"]) for b in alike) == by_length.steps * batch
        for b in alike:  # padded to the longest row of the batch, no further
            assert b["item"].shape[1] == int((b["item"] > 0).sum(1).max())
        assert sum(b["item"].numel() for b in alike) < sum(b["item"].numel() for b in plain)
        tail = read(by_length, rank, skip=2)
        for a, b in zip(alike[2:], tail, strict=True):
            assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.spark
def test_evaluation_reads_every_client_once_in_batches_of_alike_length(tiny_features):
    from hvd_ctsm.data.batches import eval_batches, read_metadata

    url, batch = split_url(tiny_features, "validation"), 4
    meta = read_metadata(tiny_features)
    batches = [b for rank in range(2) for b in eval_batches(url, rank, 2, batch, meta.max_len)]
    clients = [c for b in batches for c in b["client_id"]]
    assert len(clients) == len(set(clients)) == meta.splits["validation"]["rows"]
    for b in batches:
        lengths = (b["item"] > 0).sum(1)
        assert b["item"].shape[1] == int(lengths.max())  # padded to its longest, no further
        assert lengths.tolist() == sorted(lengths.tolist())
