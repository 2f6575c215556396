"""hvd_ctsm.spark_session without Spark: where Ctrl-C finds the driver's main thread, and what
happens to the JVM's log while a job runs (a process started here stands in for the JVM)."""

import errno
import os
import subprocess
import sys
import time

import pytest

from hvd_ctsm import spark_session, spark_start
from hvd_ctsm.spark_session import spark_log_kept_back, waiting_on_the_jvm
from hvd_ctsm.spark_start import JvmStderr


def frame_inside(filename: str):
    """The frame of a function compiled as if it were in `filename`, called from here."""
    namespace = {}
    exec(compile("def call(f):\n    return f()\n", filename, "exec"), namespace)
    return namespace["call"](lambda: sys._getframe())


def test_a_frame_under_a_py4j_call_is_waiting_on_the_jvm_and_others_are_not():
    py4j = os.path.join(os.sep, "venv", "site-packages", "py4j", "clientserver.py")
    assert waiting_on_the_jvm(frame_inside(py4j))
    assert not waiting_on_the_jvm(frame_inside(os.path.join(os.sep, "work", "py4jish.py")))
    assert not waiting_on_the_jvm(sys._getframe()) and not waiting_on_the_jvm(None)


class FakeJvm:
    """A process started while its stderr is held, as Spark's JVM is at a session's start (it
    inherits the pipe), that writes to it what it is told to; the start then succeeded."""

    def __init__(self):
        self.stderr = JvmStderr()
        self.process = subprocess.Popen(
            [sys.executable, "-c", "import sys\nwhile line := sys.stdin.readline():\n"
             "    sys.stderr.write(line); sys.stderr.flush(); print(flush=True)"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.stderr.restore()
        self.stderr.release()

    def logs(self, text: str) -> None:
        """Write `text` (whole lines) to the JVM's stderr; back once the copying thread has
        read it (not a fixed sleep, which a loaded machine can outlast)."""
        self.process.stdin.write(text)
        self.process.stdin.flush()
        for _ in range(text.count("\n")):  # each line written to the pipe
            self.process.stdout.readline()
        self.stderr._drain()  # and read from it (held, passed on or delayed, as it must be)

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


@pytest.fixture
def start_jvm(monkeypatch):
    """Start a FakeJvm as the running JVM: from the test itself, where capfd captures fd 2
    (pytest captures a fixture's setup elsewhere)."""
    started: list[FakeJvm] = []

    def start() -> FakeJvm:
        started.append(FakeJvm())
        monkeypatch.setattr(spark_start, "running_jvm_stderr", lambda: started[0].stderr)
        return started[0]

    yield start
    for jvm in started:
        jvm.stop()


def test_a_jobs_spark_log_is_dropped_for_a_full_disk_and_kept_for_other_errors(start_jvm, capfd):
    """A feature job that filled the disk printed each failed task's Java trace (411 lines for
    the tiny synthetic job) above its one line; other failures keep Spark's log, their clue."""
    jvm = start_jvm()
    with pytest.raises(OSError), spark_log_kept_back():
        jvm.logs("ERROR Utils: Aborting task\njava.io.IOException: No space left on device\n")
        assert capfd.readouterr().err == ""  # held while the job runs
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "out/train")
    assert capfd.readouterr().err == ""
    with pytest.raises(RuntimeError), spark_log_kept_back():
        jvm.logs("ERROR Executor: the only clue\n")
        raise RuntimeError("Job aborted due to stage failure")
    assert capfd.readouterr().err == "ERROR Executor: the only clue\n"
    jvm.logs("after the job\n")  # at once again
    assert capfd.readouterr().err == "after the job\n"


def test_a_jobs_spark_log_goes_on_late_while_it_runs(start_jvm, capfd, monkeypatch):
    jvm = start_jvm()
    monkeypatch.setattr(spark_session, "JOB_LOG_DELAY_S", 2.0)  # long beside a step here
    with spark_log_kept_back():
        jvm.logs("WARN a lost executor\n")
        assert capfd.readouterr().err == ""
        said, deadline = "", time.monotonic() + 30  # the delay, then the thread's next poll
        while not said and time.monotonic() < deadline:
            time.sleep(0.1)
            said = capfd.readouterr().err
        assert said == "WARN a lost executor\n"
