"""Ctrl-C while the driver waits on a Spark job (hvd_ctsm.spark_session.cancel_jobs_on_ctrl_c):
the job is cancelled, the command says so in one line and exits 130; a SIGTERM alike, exit 143."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.both_stacks]  # PySpark 3.5 and 4


STOPS = {  # the signal, what the command's line starts with, and its exit code
    "ctrl-c": (signal.SIGINT, "interrupted", 130),
    "sigterm": (signal.SIGTERM, "stopped by SIGTERM", 143)}


@pytest.mark.parametrize("stop, to_group", [
    ("ctrl-c", True),  # a terminal's Ctrl-C: the whole group
    ("sigterm", False),  # a scheduler's stop of the process (a container's PID 1, `timeout`)
    ("sigterm", True)])  # ... or of its group: Spark's JVM has SIGTERM too, and stops at once
def test_ctrl_c_or_sigterm_during_a_spark_job_cancels_it_and_ends_in_one_line(stop, to_group):
    """Before, PySpark's handler raised KeyboardInterrupt inside the Py4J call: the connection
    to the JVM broke, Py4J logged tracebacks, and the command "crashed" (exit 3). A SIGTERM
    ended the process where it was, saying nothing (a stage left, pipeline.json "running")."""
    worker = Path(__file__).parents[1] / "helpers" / "spark_ctrl_c_worker.py"
    proc = subprocess.Popen([sys.executable, str(worker)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            start_new_session=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.strip() == "job running":  # inside count(): the driver waits on the JVM
            break
    time.sleep(1)
    started = time.monotonic()
    sent, outcome, code = STOPS[stop]
    (os.killpg if to_group else os.kill)(proc.pid, sent)
    rest = proc.stdout.read()
    assert proc.wait(timeout=60) == code, "".join(seen) + rest
    assert time.monotonic() - started < 30  # cancelled, not run to its end (about 40 s)
    assert "job finished" not in rest and "Traceback" not in rest, rest
    assert rest.strip().splitlines() == [
        f"ctrl-c-test: {outcome}: Spark's running jobs were cancelled"], rest


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_during_the_pipelines_training_ends_it_in_one_line(tmp_path, stop):
    """Horovod's route on the classic stack, TorchDistributor's on the other. Before, under
    Horovod: its "Exit code: 143" after a thread's 30-line traceback, exit 3, and its signal
    handlers stayed (a later Ctrl-C did nothing); pipeline.json said "running" for good, as it
    did after a SIGTERM on either route. Ctrl-C goes to the group, as a terminal sends it; the
    SIGTERM to the pipeline's process only, as a scheduler's. (A feature step's Spark job
    cancelled: tests/unit/test_pipeline_steps.py.)"""
    work = tmp_path / "work"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hvd_ctsm", "pipeline", "--work", str(work),
         "--source", "synthetic:clients=200,items=50,events=6000,seed=3",
         "--registry", str(tmp_path / "registry"), "--row-groups", "4", "--max-len", "30",
         "epochs=100", "data.batch_size=16", "model.dim=16", "model.layers=1", "progress=false",
         "tracking.enabled=false", "dist.threads_per_rank=1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        start_new_session=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    ready = "hvd_ctsm.train: epoch 2 val"  # the ranks train
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if ready in line:
            break
    assert ready in seen[-1], "".join(seen)
    time.sleep(2)
    sent, outcome, code = STOPS[stop]
    (os.killpg if stop == "ctrl-c" else os.kill)(proc.pid, sent)
    said = "".join(seen) + proc.stdout.read()
    assert proc.wait(timeout=120) == code, said
    ours = [line for line in said.splitlines() if line.startswith("hvd-ctsm pipeline:")]
    assert len(ours) == 1 and ours[0].startswith(f"hvd-ctsm pipeline: {outcome}"), said
    assert "Traceback" not in said, said
    record = json.loads((work / "pipeline.json").read_text())
    assert record["result"] == outcome, record
    assert record["steps"][-1]["step"] == "train" and \
        record["steps"][-1]["outcome"] == outcome, record
