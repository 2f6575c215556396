"""Helpers for the fault-injection tests: start the real trainer, wait for a file, kill for real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import torch

from hvd_ctsm import distributed
from hvd_ctsm.model.checkpoint import load_state

HOROVODRUN = str(Path(sys.executable).with_name("horovodrun"))
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
# Small and quick; validate every epoch and never stop early (tests count validations).
# No MLflow run: importing MLflow and opening a fresh store took about 5 s of each of these
# 10-15 s runs. Tracking is tested where it is the subject (test_tracking, the demo, the
# pipelines, the cluster, the notebook) and in the runs that pass TRACKED: the two-rank runs
# under each launcher, which check that rank 0 alone logs one run, and the elastic run.
SMALL = ["data.batch_size=16", "model.dim=32", "model.layers=1", "model.dropout=0.1",
         "optim.lr=0.005", "optim.warmup_steps=5", "log_every_steps=2", "progress=false",
         "eval_every_epochs=1", "early_stop_evals=0", "tracking.enabled=false"]
TRACKED = "tracking.enabled=true"


def two_ranks(engine: str | None = None) -> list[str]:
    """A two-rank launcher on this host, in front of a trainer command: horovodrun (Gloo) or
    torchrun; None: horovodrun where Horovod is installed (the classic stack), else torchrun."""
    if engine is None:
        engine = "horovod" if distributed.horovod_importable() else "torch"
    if engine == "horovod":
        return [HOROVODRUN, "-np", "2", "--gloo"]
    return [TORCHRUN, "--standalone", "--nproc-per-node", "2", "--no-python"]


def trainer_cmd(data, out, *extra, np_: int = 1, launcher: list[str] | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "hvd_ctsm.train", "--data", str(data), "--out", str(out),
           *SMALL, *extra]
    if np_ > 1 or launcher:
        cmd = (launcher or [HOROVODRUN, "-np", str(np_), "--gloo"]) + cmd
    return cmd


def mlflow_runs(out: Path) -> list:
    """The MLflow runs of every experiment in the store the trainer of run folder `out` used."""
    from mlflow import MlflowClient

    from hvd_ctsm.tracking.link import tracking_uri

    client = MlflowClient(tracking_uri("", out)[0])
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def env_with(**extra) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def run(cmd, timeout=300, check=True, **env) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=env_with(**env))
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def start(cmd, log_path: Path, **env) -> subprocess.Popen:
    """Start in a new session so that the whole job can be killed; output goes to log_path."""
    log = open(log_path, "w")  # noqa: SIM115  closed by the process's exit
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env_with(**env),
                            start_new_session=True)


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 240, what: str = ""):
    """Poll until predicate() is truthy; fail if the process ended first or time ran out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"process ended (rc={proc.returncode}) before {what}")
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def sigkill_tree(proc: subprocess.Popen) -> float:
    """SIGKILL the launcher and every process under it (workers first); returns the kill time."""
    parent = psutil.Process(proc.pid)
    victims = parent.children(recursive=True) + [parent]
    killed_at = time.monotonic()
    for p in victims:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=30)
    psutil.wait_procs(victims, timeout=10)
    return killed_at


def checkpoint_steps(out: Path) -> list[int]:
    return sorted(int(p.name[5:14]) for p in (Path(out) / "checkpoints").glob("step-*.pt"))


def mid_epoch_checkpoint(out: Path, at_least: int):
    """The newest complete (checksum written) checkpoint at or after step `at_least`, or None."""
    steps = [s for s in checkpoint_steps(out) if s >= at_least
             and (Path(out) / "checkpoints" / f"step-{s:09d}.pt.sha256").exists()]
    return steps[-1] if steps else None


def same_model(a: Path, b: Path) -> bool:
    x, y = load_state(a)["model"], load_state(b)["model"]
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def max_abs_difference(a: Path, b: Path) -> float:
    x, y = load_state(a)["model"], load_state(b)["model"]
    return max(float((x[k].float() - y[k].float()).abs().max()) for k in x)


def summary(out: Path) -> dict:
    return json.loads((Path(out) / "train_summary.json").read_text())


def read_jsonl(path) -> list[dict]:
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def record(test: str, **values) -> None:
    """Measurements for docs/RELIABILITY.md: appended to $HVD_CTSM_RELIABILITY_LOG when set."""
    path = os.environ.get("HVD_CTSM_RELIABILITY_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": test} | values) + "\n")


def damage_pages(path: Path, column: int = 0) -> None:
    """Flip 400 bytes of a Parquet file's first row group's `column` pages in place: its size,
    footer and row counts stay, so only reading those pages finds the damage."""
    import pyarrow.parquet as pq

    start = pq.ParquetFile(path).metadata.row_group(0).column(column).data_page_offset + 20
    data = bytearray(path.read_bytes())
    data[start:start + 400] = bytes(b ^ 0x5A for b in data[start:start + 400])
    path.write_bytes(bytes(data))
