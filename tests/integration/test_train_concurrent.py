"""A `train` started into the run folder of one still training, as an overlapping scheduled
job's is, and the first one killed: real trainer processes on the real tiny dataset."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def train_command(data: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "hvd_ctsm.train", "--data", str(data), "--out", str(out),
            "--epochs", "4", "data.batch_size=16", "model.dim=16", "model.layers=1",
            "progress=false", "checkpoint_every_steps=2", *extra]


def wait_for_a_checkpoint(run: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while not list(run.glob("checkpoints/step-*.pt")):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no checkpoint after 300 s"
        time.sleep(0.2)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.faults
def test_a_second_train_into_a_running_run_is_refused_and_a_killed_one_resumes(tiny_features,
                                                                                tmp_path):
    """Before: a second `train` into the folder, plain or with --resume, trained beside the
    first (their checkpoints, logs and MLflow link in one folder, both exit 0); with
    --overwrite it emptied the folder under the first, which went on writing into it."""
    run = tmp_path / "run"
    slow = 'debug.step_delay_s={"*": 2}'  # the first run lasts while the others try
    first = subprocess.Popen(train_command(tiny_features, run, slow), env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_a_checkpoint(run, first)
        before = sorted(p.name for p in run.rglob("*"))
        for flags in ([], ["--overwrite"], ["--resume"]):
            second = subprocess.run(train_command(tiny_features, run, *flags), env=ENV,
                                    capture_output=True, text=True, timeout=300)
            assert second.returncode == 2, (flags, second.stderr[-3000:])
            # one line (after --resume's note of the settings it takes)
            error = second.stderr.splitlines()[-1]
            assert "error: another `train` is writing" in error, second.stderr
            assert "Traceback" not in second.stderr, second.stderr
        assert first.poll() is None, "the first run stopped"
        assert set(before) <= {p.name for p in run.rglob("*")}  # nothing of it was removed
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
    # The kernel dropped the killed run's hold: the same command with --resume goes on.
    again = train_command(tiny_features, run, "--resume", "debug.step_delay_s={}")
    resumed = subprocess.run(again, env=ENV, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (run / "model.pt").is_file()
