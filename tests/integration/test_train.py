"""The trainer end to end on a tiny real dataset: real Horovod ranks, real Petastorm shards.

Runs the real entry point (`python -m hvd_ctsm.train`, under `horovodrun -np 2` where it says).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from hvd_ctsm.model.checkpoint import load_state
from tests.helpers import faultlib as fl

pytestmark = [pytest.mark.horovod, pytest.mark.spark, pytest.mark.slow]


def run_trainer(data, out, *extra, np_=1, check=True, transport="gloo"):
    cmd = [sys.executable, "-m", "hvd_ctsm.train", "--data", str(data), "--out", str(out),
           *fl.SMALL, *extra]
    if np_ > 1:
        cmd = [fl.HOROVODRUN, "-np", str(np_), f"--{transport}", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_two_ranks_learn_stay_in_sync_and_only_rank0_writes(tiny_features, tmp_path):
    out = tmp_path / "run"
    run_trainer(tiny_features, out, "--epochs", "6", fl.TRACKED, np_=2)
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["ranks"] == 2
    checksums = summary["parameter_checksums"]
    assert len(checksums) == 2 and checksums[0] == checksums[1]  # identical parameters
    losses = [r["loss/next_item"] for r in fl.read_jsonl(out / "train_log.jsonl")]
    assert len(losses) >= 4
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 * 0.95  # the loss falls
    # Only rank 0 writes: one TensorBoard event file, one set of checkpoints.
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1
    ckpts = sorted(p.name for p in (out / "checkpoints").glob("step-*.pt"))
    assert ckpts and len(ckpts) <= 3
    validation = fl.read_jsonl(out / "metrics.jsonl")
    assert len(validation) == 6 and validation[-1]["full"]["targets"] > 0
    assert (out / "model.pt").exists() and (out / "config.yaml").exists()
    assert [r.info.status for r in fl.mlflow_runs(out)] == ["FINISHED"]  # rank 0's, alone


def test_resume_continues_exactly_where_it_stopped(tiny_features, tmp_path):
    """At np=1 with one reader worker the run is deterministic: stop mid-epoch, resume, and the
    final model equals an uninterrupted run's, bit for bit. With a moving average of the
    weights (optim.ema_decay; test_reliability_restart resumes without one) the average
    resumes too, restarting it would change the model, and the validated average is the model."""
    average = ["optim.ema_decay=0.9"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    run_trainer(tiny_features, whole, "--epochs", "2", *average)
    steps_per_epoch = json.loads((whole / "train_summary.json").read_text())["steps_per_epoch"]
    stop = steps_per_epoch + steps_per_epoch // 2  # in the middle of the second epoch
    run_trainer(tiny_features, parts, "--epochs", "2", f"max_steps={stop}", *average)
    latest = load_state(sorted((parts / "checkpoints").glob("step-*.pt"))[-1])
    assert latest["position"]["step"] == stop
    assert latest["position"]["epoch"] == 1
    assert latest["position"]["batch"] == stop - steps_per_epoch
    # --resume keeps the run's own settings: max_steps=0 lifts the stop it was given
    run_trainer(tiny_features, parts, "--epochs", "2", "--resume", "max_steps=0", *average)
    a = load_state(whole / "model.pt")["model"]
    b = load_state(parts / "model.pt")["model"]
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    best = load_state(whole / "checkpoints" / "best.pt")  # the average, not the weights
    assert all(torch.equal(a[k], best["weight_average"]["weights"][k]) for k in a)
    assert not all(torch.equal(a[k], best["model"][k]) for k in a)


def test_a_resume_under_another_effective_batch_goes_on_from_the_epochs_end_at_its_lr(
        tiny_features, tmp_path):
    """Stopped at an epoch's end on 2 ranks and resumed on 1, epoch 2 runs as in a run on 1
    rank from the start: its steps and its lr (scaled to 1 rank's batch), step for step.
    Stopped inside an epoch, the other world size is refused in one line."""
    one, parts = tmp_path / "one", tmp_path / "parts"
    run_trainer(tiny_features, one, "--epochs", "2")
    per_epoch = json.loads((one / "train_summary.json").read_text())["steps_per_epoch"]
    run_trainer(tiny_features, parts, "--epochs", "1", np_=2)
    assert load_state(parts / "model.pt")  # a whole epoch, so its last checkpoint is its end
    run_trainer(tiny_features, parts, "--epochs", "2", "--resume")
    summary = json.loads((parts / "train_summary.json").read_text())
    assert summary["ranks"] == 1 and summary["steps"] == 2 * per_epoch
    lr = {r["step"]: r["lr"] for r in fl.read_jsonl(one / "train_log.jsonl")}
    resumed = {r["step"]: r["lr"] for r in fl.read_jsonl(parts / "train_log.jsonl")
               if r["step"] > per_epoch}
    assert resumed and all(lr[s] == pytest.approx(v, rel=1e-6) for s, v in resumed.items())

    mid = tmp_path / "mid"
    run_trainer(tiny_features, mid, "--epochs", "2", "max_steps=1", np_=2)
    proc = run_trainer(tiny_features, mid, "--epochs", "2", "--resume", check=False)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines()
              if line.startswith("hvd-ctsm train: error:")]
    assert errors and "1 step into epoch 1" in errors[0] and "(1 rank x" in errors[0]
    assert "Traceback" not in proc.stderr


def test_a_resume_under_a_larger_batch_keeps_its_own_checkpoints_not_the_earlier_ones(
        tiny_features, tmp_path):
    """Under a larger effective batch a resumed run numbers its steps anew from its epoch, lower
    than the checkpoints it resumed from. Pruned by step number, its own were removed in their
    favour (keep_checkpoints=1: each as it was written), and the next --resume went back to
    epoch 2. The earlier ones are kept, renamed, once the resumed run's first one is written."""
    run = tmp_path / "run"
    run_trainer(tiny_features, run, "--epochs", "2", "keep_checkpoints=1")
    before = sorted((run / "checkpoints").glob("step-*.pt"))
    assert len(before) == 1 and load_state(before[0])["position"]["epoch"] == 2
    run_trainer(tiny_features, run, "--epochs", "3", "keep_checkpoints=1", "data.batch_size=32",
                "--resume")
    after = sorted((run / "checkpoints").glob("step-*.pt"))
    assert len(after) == 1 and load_state(after[0])["position"]["epoch"] == 3, after
    assert load_state(after[0])["position"]["step"] < load_state(
        run / "checkpoints" / f"{before[0].name}.before-resume")["position"]["step"]


def test_a_damaged_best_checkpoint_ends_the_run_with_the_last_weights_not_a_crash(
        tiny_features, tmp_path):
    """--resume loads the newest step checkpoint and never reads best.pt; damaged, best.pt
    then crashed the run at its very end, without model.pt, and every --resume after it the
    same way. A learning rate too small to move a weight keeps epoch 1 the best."""
    run = tmp_path / "run"
    still = ["optim.lr=1e-30"]
    run_trainer(tiny_features, run, "--epochs", "2", *still)
    best = run / "checkpoints" / "best.pt"
    best.write_bytes(best.read_bytes()[:100])
    proc = run_trainer(tiny_features, run, "--epochs", "3", *still, "--resume")
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["steps"] == 3 * summary["steps_per_epoch"] and summary["model_epoch"] is None
    assert "checksum mismatch" in proc.stderr and "keeping the last weights instead of epoch " \
        "1's (the best validated)" in proc.stderr, proc.stderr[-3000:]
    assert load_state(run / "model.pt")


def test_a_resume_of_a_run_that_stopped_early_trains_nothing(tiny_features, tmp_path):
    """Before, each --resume of a finished run trained one more epoch and stopped again (a
    pipeline retrying with --resume grew the run). A learning rate too small to move a weight
    makes every validation equal, so the run stops early after epoch 3 (best: epoch 1)."""
    run = tmp_path / "run"
    still = ["epochs=30", "early_stop_evals=2", "early_stop_rows=0", "optim.lr=1e-30"]
    run_trainer(tiny_features, run, *still)
    stopped = json.loads((run / "train_summary.json").read_text())
    assert stopped["steps"] == 3 * stopped["steps_per_epoch"]
    proc = run_trainer(tiny_features, run, *still, "--resume")
    assert json.loads((run / "train_summary.json").read_text())["steps"] == stopped["steps"]
    assert "the run stopped early after epoch 3 (no better validation since epoch 1;" \
        in proc.stderr
    proc = run_trainer(tiny_features, run, *still, "data.batch_size=8", "--resume")
    assert json.loads((run / "train_summary.json").read_text())["steps"] == stopped["steps"]
    assert "nothing left to train" in proc.stderr  # not first "epoch 4 starts at step 40 of 12"
    assert "starts at step" not in proc.stderr, proc.stderr
    proc = run_trainer(tiny_features, run, *still, "early_stop_evals=3", "--resume")
    assert json.loads((run / "train_summary.json").read_text())["steps"] == \
        4 * stopped["steps_per_epoch"]  # a larger patience goes on, one more epoch here


def test_a_dataset_of_another_schema_version_stops_before_training(tiny_features, tmp_path):
    import shutil

    data = tmp_path / "old"
    shutil.copytree(tiny_features, data)
    meta = json.loads((data / "metadata.json").read_text())
    meta["schema_version"] = 0
    (data / "metadata.json").write_text(json.dumps(meta))
    proc = run_trainer(data, tmp_path / "run", check=False)
    assert proc.returncode != 0
    assert "schema version 0, this trainer reads 1" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("transport, knobs", [
    ("gloo", ["dist.backward_passes_per_step=2", "dist.compression=fp16",
              "dist.fusion_threshold_mb=1", "dist.cycle_time_ms=5", "data.batch_size=8"]),
    ("mpi", ["dist.op=adasum"]),
    ("gloo", ["data.balance=targets"]),
])
def test_distributed_knobs_train_in_sync(tiny_features, tmp_path, transport, knobs):
    out = tmp_path / "run"
    run_trainer(tiny_features, out, "--epochs", "1", *knobs, np_=2, transport=transport)
    summary = json.loads((out / "train_summary.json").read_text())
    checksums = summary["parameter_checksums"]
    assert summary["steps"] == summary["steps_per_epoch"] > 0
    assert len(checksums) == 2 and checksums[0] == checksums[1]


def test_adasum_over_gloo_stops_with_a_clear_error(tiny_features, tmp_path):
    proc = run_trainer(tiny_features, tmp_path / "run", "dist.op=adasum", np_=2, check=False)
    assert proc.returncode != 0
    assert "needs Horovod's MPI controller" in proc.stdout + proc.stderr
