"""Ctrl-C while the driver waits on a Spark job (hvd_ctsm.spark_session.cancel_jobs_on_ctrl_c):
the job is cancelled, the command says so in one line and exits 130."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.both_stacks]  # PySpark 3.5 and 4


def test_ctrl_c_during_a_spark_job_cancels_it_and_ends_in_one_line_and_130():
    """Before, PySpark's handler raised KeyboardInterrupt inside the Py4J call: the connection
    to the JVM broke, Py4J logged tracebacks, and the command "crashed" (exit 3)."""
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
    os.killpg(proc.pid, signal.SIGINT)
    rest = proc.stdout.read()
    assert proc.wait(timeout=60) == 130, "".join(seen) + rest
    assert time.monotonic() - started < 30  # cancelled, not run to its end (about 40 s)
    assert "job finished" not in rest and "Traceback" not in rest, rest
    assert rest.strip().splitlines() == ["ctrl-c-test: interrupted: Spark's running jobs were "
                                         "cancelled"], rest
