"""The torch.distributed backend beside Horovod: real torchrun workers (DDP over Gloo), the real
trainer entry point, and runs that move between the two backends.

The two backends train the same numbers: a run stopped under one and resumed under the other ends
with the model an uninterrupted run ends with, bit for bit, and writes the same run folder.
The unit-tier part is in tests/unit/test_torch_backend.py."""

import subprocess
from pathlib import Path

import psutil
import pytest
import torch

from hvd_ctsm.model.checkpoint import load_state
from tests.helpers import faultlib as fl

HOROVOD_NP2 = fl.two_ranks("horovod")
EVERY = 4  # checkpoint_every_steps
RUN = ["--epochs", "2", f"checkpoint_every_steps={EVERY}", "keep_checkpoints=3"]
PER_EPOCH = 7  # optimizer steps per epoch of the tiny dataset at np=2


def torchrun(*flags: str) -> list[str]:
    return [fl.TORCHRUN, "--standalone", "--nproc-per-node", "2", *flags]


def trainer_torchrun(*flags: str) -> list[str]:
    """torchrun in front of the trainer command faultlib builds (`python -m hvd_ctsm.train`)."""
    return torchrun(*flags, "--no-python")


def launcher(backend: str) -> list[str]:
    return trainer_torchrun() if backend == "torch" else HOROVOD_NP2


@pytest.mark.both_stacks
@pytest.mark.spark
@pytest.mark.slow
def test_torchrun_two_ranks_learn_stay_in_sync_and_only_rank0_writes(tiny_features, tmp_path):
    out = tmp_path / "run"
    proc = fl.run(fl.trainer_cmd(tiny_features, out, "--epochs", "6", fl.TRACKED,
                                 launcher=trainer_torchrun()))
    assert "backend=torch ranks=2" in proc.stderr
    summary = fl.summary(out)
    checksums = summary["parameter_checksums"]
    assert summary["ranks"] == 2 and len(checksums) == 2 and checksums[0] == checksums[1]
    losses = [r["loss/next_item"] for r in fl.read_jsonl(out / "train_log.jsonl")]
    assert len(losses) >= 4
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 * 0.95  # the loss falls
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert 1 <= len(list((out / "checkpoints").glob("step-*.pt"))) <= 3
    assert len(fl.read_jsonl(out / "metrics.jsonl")) == 6
    assert (out / "model.pt").exists() and (out / "config.yaml").exists()
    assert [r.info.status for r in fl.mlflow_runs(out)] == ["FINISHED"]  # rank 0's, alone


@pytest.mark.spark
@pytest.mark.slow
def test_torch_knobs_accumulation_fp16_and_bucket_size_train_in_sync(tiny_features, tmp_path):
    out = tmp_path / "run"
    fl.run(fl.trainer_cmd(tiny_features, out, "--epochs", "1", "dist.backward_passes_per_step=2",
                          "dist.compression=fp16", "dist.fusion_threshold_mb=1",
                          "data.batch_size=8", launcher=trainer_torchrun()))
    summary = fl.summary(out)
    assert summary["steps"] == summary["steps_per_epoch"] > 0
    assert len(set(summary["parameter_checksums"])) == 1


@pytest.mark.spark
def test_horovod_only_settings_stop_a_torch_run_with_the_fix(tiny_features, tmp_path):
    proc = fl.run(fl.trainer_cmd(tiny_features, tmp_path / "run", "dist.op=adasum",
                                 launcher=trainer_torchrun()), check=False)
    assert proc.returncode != 0
    assert "error: dist.op=adasum needs Horovod" in proc.stderr
    assert "hvd_ctsm/train" not in proc.stderr  # a one-line error, not our traceback
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def whole_run(tiny_features, tmp_path_factory) -> Path:
    """An uninterrupted np=2 run: what every interrupted run below must end with. Under Horovod
    where it is installed (the classic stack), else torchrun: both train the same numbers (the
    cross-backend resumes below compare the two, bit for bit)."""
    out = tmp_path_factory.mktemp("whole") / "run"
    fl.run(fl.trainer_cmd(tiny_features, out, *RUN, launcher=fl.two_ranks()))
    return out


def run_folder(out: Path) -> dict:
    """What a run folder holds, minus what differs between any two runs (times, host names and
    the folder's own path): the last checkpoint whole (model, optimizer, schedule, position,
    every rank's RNG)."""
    last = load_state(out / "checkpoints" / f"step-{2 * PER_EPOCH:09d}.pt")
    last["config"].pop("out")
    config = [line for line in (out / "config.yaml").read_text().splitlines()
              if not line.startswith("out:")]
    return {"files": sorted(p.name for p in out.iterdir()), "last_checkpoint": plain(last),
            "summary": fl.summary(out), "metrics": fl.read_jsonl(out / "metrics.jsonl"),
            "config": config}


def plain(value):
    """Tensors as (dtype, shape, values) lists, so that == compares them exactly."""
    if isinstance(value, torch.Tensor):
        return str(value.dtype), list(value.shape), value.flatten().tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


@pytest.mark.horovod
@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("first, then", [("torch", "horovod"), ("horovod", "torch")])
def test_a_run_stopped_under_one_backend_resumes_under_the_other(tiny_features, tmp_path,
                                                                 whole_run, first, then):
    out = tmp_path / "run"
    stop = PER_EPOCH + 3  # inside the second epoch
    fl.run(fl.trainer_cmd(tiny_features, out, *RUN, f"max_steps={stop}",
                          launcher=launcher(first)))
    assert fl.checkpoint_steps(out)[-1] == stop
    # --resume keeps the run's own settings: max_steps=0 lifts the stop it was given
    proc = fl.run(fl.trainer_cmd(tiny_features, out, *RUN, "--resume", "max_steps=0",
                                 launcher=launcher(then)))
    assert f"resumed from step {stop} " in proc.stdout + proc.stderr
    assert fl.same_model(whole_run / "model.pt", out / "model.pt")
    assert run_folder(out) == run_folder(whole_run)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.faults
def test_torchrun_restarts_after_a_worker_is_sigkilled_and_resumes(tiny_features, tmp_path,
                                                                   whole_run):
    """torchrun --max-restarts 1: one worker SIGKILLed inside epoch 2; torchrun stops the other,
    starts both again, and they resume from the latest checkpoint to the same final model."""
    out, log = tmp_path / "run", tmp_path / "torchrun.log"
    slow = 'debug.step_delay_s={"*": 0.15}'  # so that the kill lands mid-epoch
    proc = fl.start(fl.trainer_cmd(tiny_features, out, *RUN, slow,
                                   launcher=trainer_torchrun("--max-restarts", "1")), log)
    step = fl.wait_for(lambda: fl.mid_epoch_checkpoint(out, PER_EPOCH + 1), proc,
                       what="a checkpoint inside the second epoch")
    victim = worker_of_rank(proc, 1)
    victim.kill()
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "restart 1 by torchrun" in text
    resumed = int(text.split("resumed from step ")[1].split()[0])
    assert resumed >= step and resumed % EVERY == 0
    events = [e for e in fl.read_jsonl(out / "events.jsonl")
              if e["event"] == "restarted_by_torchrun"]
    assert [e["restart"] for e in events] == [1]
    assert fl.summary(out)["steps"] == 2 * PER_EPOCH
    assert fl.same_model(whole_run / "model.pt", out / "model.pt")
    fl.record("torchrun_restart_np2", killed_after_checkpoint=step, resumed_from=resumed)


def worker_of_rank(proc: subprocess.Popen, rank: int) -> psutil.Process:
    """The trainer process torchrun started as `rank` (its RANK variable)."""
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank) and "hvd_ctsm.train" in child.cmdline():
                return child
        except psutil.Error:
            continue
    raise AssertionError(f"no worker of rank {rank} under torchrun")


@pytest.mark.both_stacks
@pytest.mark.spark
@pytest.mark.slow
def test_torch_distributor_trains_on_spark_tasks_like_horovod_spark(spark, tiny_features,
                                                                     tmp_path, whole_run):
    """dist.backend=torch on Spark: TorchDistributor on local[2]'s tasks (local_mode=False)."""
    from hvd_ctsm.train.spark_train import train_on_spark

    out = tmp_path / "run"
    summary = train_on_spark(fl.trainer_cmd(tiny_features, out, *RUN, "dist.backend=torch",
                                            "dist.threads_per_rank=1")[3:],
                             num_proc=2, spark=spark)
    assert summary["ranks"] == 2 and summary["steps"] == 2 * PER_EPOCH
    assert len(set(summary["parameter_checksums"])) == 1
    assert fl.same_model(whole_run / "model.pt", out / "model.pt")


@pytest.mark.both_stacks
@pytest.mark.spark
def test_a_rank_that_failed_first_is_the_drivers_line_under_torch_distributor(
        spark, tiny_features, tmp_path):
    """TorchDistributor returns rank 0's result alone. Rank 1 read a damaged file of its shard
    and stopped; rank 0 only saw it go, and the driver said rank 0's line ("another rank
    stopped while this one was exchanging with it"), the cause only in rank 1's executor log.
    Rank 1 leaves its line in torchrun's agents' store, and rank 0 brings it back."""
    import shutil

    from hvd_ctsm.train.spark_train import SparkTrainingError, train_on_spark

    data = tmp_path / "data"
    shutil.copytree(tiny_features, data)
    damaged = data / "train" / "part-00001.parquet"  # row group 1: rank 1's alone
    fl.damage_pages(damaged, column=2)  # the item column: the plan reads target_pos only
    with pytest.raises(SparkTrainingError) as err:
        train_on_spark(fl.trainer_cmd(data, tmp_path / "run", *RUN, "dist.backend=torch",
                                      "dist.threads_per_rank=1")[3:], num_proc=2, spark=spark)
    assert str(err.value).startswith(f"training on Spark failed on rank 1: {damaged}: row group "
                                     "0 cannot be read ("), str(err.value)
    assert str(err.value).endswith("the file is damaged; rebuild the features with "
                                   "spark_jobs.build_features"), str(err.value)
