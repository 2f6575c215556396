"""Annealing on the plateau (anneal_after_evals): when it fires, how early stopping counts after
it, the lower lr, and a real two-rank run that anneals, stays in sync and resumes annealed.
The unit-tier part is in tests/unit/test_anneal.py."""

import json

import pytest

from tests.helpers import faultlib as fl


@pytest.mark.horovod
@pytest.mark.spark
@pytest.mark.slow
def test_two_ranks_anneal_in_sync_and_a_resume_keeps_the_lower_lr(tiny_features, tmp_path):
    """At an lr of 1e-9 the ranking cannot change between validations, so validation 2 is no
    better than validation 1 and the anneal fires there, deterministically; the weights still
    move (by about 1e-9), so a rank that did not go back to the best weights would end with
    other parameters than rank 0."""
    args = ["--epochs", "4", "optim.lr=1e-9", "anneal_after_evals=1", "early_stop_evals=0"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    fl.run(fl.trainer_cmd(tiny_features, whole, *args, np_=2))
    summary = json.loads((whole / "train_summary.json").read_text())
    assert summary["best"]["annealed_at"] == 2 and summary["model_epoch"] == 1
    checksums = summary["parameter_checksums"]
    assert len(checksums) == 2 and checksums[0] == checksums[1]
    lr = {r["step"]: r["lr"] for r in fl.read_jsonl(whole / "train_log.jsonl")}
    per_epoch = summary["steps_per_epoch"]
    before = max(s for s in lr if s <= 2 * per_epoch)
    after = min(s for s in lr if s > 2 * per_epoch)
    assert 0.08 < lr[after] / lr[before] < 0.12  # a tenth, give or take the cosine's steps

    stop = 3 * per_epoch - 1  # after the anneal, before the end of epoch 3
    fl.run(fl.trainer_cmd(tiny_features, parts, *args, f"max_steps={stop}", np_=2))
    # --resume keeps the run's own settings: max_steps=0 lifts the stop it was given
    fl.run(fl.trainer_cmd(tiny_features, parts, *args, "--resume", "max_steps=0", np_=2))
    resumed = {r["step"]: r["lr"] for r in fl.read_jsonl(parts / "train_log.jsonl")}
    later = [s for s in resumed if s > stop]
    assert later and all(resumed[s] == pytest.approx(lr[s], rel=1e-6) for s in later)
