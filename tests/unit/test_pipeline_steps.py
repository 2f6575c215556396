"""The pipeline's record of its steps (WORK/pipeline.json) when one is stopped: Ctrl-C, straight
or through a Spark job it cancelled, is "interrupted" (said in one line, exit 130, by
errors.run_cli), a SIGTERM "stopped by SIGTERM" (exit 143), a failure "failed". The real Ctrl-C
and SIGTERM under a pipeline are in tests/integration/test_spark_ctrl_c.py."""

from __future__ import annotations

import json

import pytest

from hvd_ctsm.errors import CTRL_C, TERMINATED, Terminated, interrupted
from spark_jobs.pipeline import PipelineConfig, StepFailed, Steps
from tests.conftest import TINY_SOURCE


def steps_in(tmp_path) -> tuple[Steps, object]:
    config = PipelineConfig(source=TINY_SOURCE, work=str(tmp_path / "work"),
                            registry=str(tmp_path / "registry"))
    return Steps(tmp_path / "work", config), lambda: json.loads(
        (tmp_path / "work" / "pipeline.json").read_text())


def cancelled_job():
    """What a Spark action raises once Ctrl-C's handler has cancelled its job."""
    raise RuntimeError("Job 1 cancelled as part of cancellation of all jobs")


def test_a_step_whose_spark_job_ctrl_c_cancelled_is_interrupted_not_failed(tmp_path):
    """Before: "error: step 'features' failed: Py4JJavaError ..." with Java's frames, exit 3,
    and pipeline.json said "running" for good."""
    steps, record = steps_in(tmp_path)
    CTRL_C.set()
    try:
        with pytest.raises(KeyboardInterrupt, match="Spark's running jobs were cancelled"):
            steps.run("features", cancelled_job)
    finally:
        CTRL_C.clear()
    assert record()["result"] == "interrupted"
    assert [(s["step"], s["outcome"]) for s in record()["steps"]] == [("features", "interrupted")]


def test_a_step_ctrl_c_stopped_in_python_is_interrupted_and_a_failure_failed(tmp_path):
    steps, record = steps_in(tmp_path)

    def stopped():
        raise KeyboardInterrupt("interrupted: the training ranks were stopped")

    with pytest.raises(KeyboardInterrupt):
        steps.run("train", stopped)
    assert record()["result"] == "interrupted"
    with pytest.raises(StepFailed, match="step 'features' failed: RuntimeError: Job 1"):
        steps.run("features", cancelled_job)  # no Ctrl-C: a failure
    assert record()["steps"][-1]["outcome"] == "failed"


def test_a_step_sigterm_stopped_is_stopped_by_sigterm_and_exits_143(tmp_path, capsys):
    """Before: SIGTERM ended the process where it was: pipeline.json said "running" for good."""
    steps, record = steps_in(tmp_path)
    CTRL_C.set()
    TERMINATED.set()
    try:
        with pytest.raises(Terminated, match="stopped by SIGTERM: Spark's running jobs") as stop:
            steps.run("features", cancelled_job)
    finally:
        CTRL_C.clear()
        TERMINATED.clear()
    assert record()["result"] == "stopped by SIGTERM"
    assert record()["steps"][-1]["outcome"] == "stopped by SIGTERM"
    assert interrupted("hvd-ctsm pipeline", stop.value) == 143
    assert interrupted("hvd-ctsm pipeline", KeyboardInterrupt()) == 130
    assert capsys.readouterr().err.splitlines() == [
        "hvd-ctsm pipeline: stopped by SIGTERM: Spark's running jobs were cancelled",
        "hvd-ctsm pipeline: interrupted"]
