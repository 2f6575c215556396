"""A full disk while a step writes: one line naming the file and the way on (exit 3), and no
file left cut short where a later run reads it.

A real "No space left on device" comes from /dev/full here; a write cut short, from a file size
limit (RLIMIT_FSIZE) in a subprocess, which needs no root. tests/integration/test_disk_full.py
fills a real small filesystem under the commands."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hvd_ctsm.errors import run_cli
from hvd_ctsm.files import outputs
from tests.conftest import REPO

DEV_FULL = Path("/dev/full")  # every write to it fails with ENOSPC
needs_dev_full = pytest.mark.skipif(not DEV_FULL.exists(), reason="no /dev/full (not Linux)")

# What Spark 4 said when a split's files did not fit (its Py4J error, less the Java frames)
SPARK_DISK_FULL = (
    "An error occurred while calling o1163.parquet.\n: org.apache.spark.SparkException: "
    "[TASK_WRITE_FAILED] Task failed while writing rows to file:/data/.my%20features.tmp-47f7c86c"
    "/validation. SQLSTATE: 58030\n\tat org.apache.spark.sql.errors.QueryExecutionErrors$."
    "taskFailedWhileWritingRowsError(QueryExecutionErrors.scala:823)\nCaused by: "
    "org.apache.hadoop.fs.FSError: java.io.IOException: No space left on device")


def fails_with(write):
    def main(argv):
        write()
        return 0
    return main


def write_to_dev_full():
    with open(DEV_FULL, "wb") as full:
        full.write(b"x" * 10)


def raise_spark_error():
    raise RuntimeError(SPARK_DISK_FULL)


def raise_as_a_copy_does():
    """shutil.copyfile's error (deploy's copy into the registry): the source named first."""
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "run/model.pt", None,
                  "registry/v0002/model.pt")


@pytest.mark.parametrize("write, says", [
    pytest.param(write_to_dev_full, "no space left on device while writing (the output's disk, "
                 "or TMPDIR", marks=needs_dev_full),
    (raise_as_a_copy_does, "no space left on device writing registry/v0002/model.pt:"),
    (raise_spark_error, "no space left on device writing /data/my features/validation:")])
def test_a_full_disk_is_one_line_naming_the_file_and_exit_3(capsys, write, says):
    """It said "crashed: OSError: [Errno 28] No space left on device" without a file, or named
    the copy's source; the feature job's was Java's stack trace on one line of 13,000
    characters. The written file is named (a stage by the output it becomes), not the one read."""
    assert run_cli(fails_with(write), "hvd-ctsm step", []) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"hvd-ctsm step: error: {says}"), err
    assert "then run the command again" in err and "crashed" not in err and "run/model" not in err


def test_a_pipeline_step_on_a_full_disk_is_one_line():
    """The pipeline printed the feature job's Py4J error as it came: 166 lines of Java."""
    from spark_jobs.pipeline import StepFailed

    failed = StepFailed("features", RuntimeError(SPARK_DISK_FULL))
    assert str(failed) == ("step 'features' failed: no space left on device writing /data/my "
                           "features/validation: free space on its disk (df -h shows how much) "
                           "or write elsewhere, then run the command again")
    assert failed.exit_code == 3


def in_a_subprocess_limited_to(max_bytes: int, code: str) -> subprocess.CompletedProcess:
    """Run `code` where no file may grow past `max_bytes`: a write past it fails (EFBIG) as a
    write to a full disk does, after the bytes that fit."""
    limited = textwrap.dedent(f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of the process
        resource.setrlimit(resource.RLIMIT_FSIZE, ({max_bytes}, {max_bytes}))
    """) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", limited], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_marker_cut_short_leaves_no_marker_and_the_folder_takes_a_run_again(tmp_path):
    """A marker cut short (0 bytes on a full disk) read as none: every later run into the
    folder was refused as not written by hvd_ctsm, --resume and --overwrite too."""
    run = tmp_path / "run"
    proc = in_a_subprocess_limited_to(20, f"""
        from hvd_ctsm.files import outputs
        outputs.claim({str(run)!r}, "run")
    """)
    assert proc.returncode != 0 and "File too large" in proc.stderr
    assert sorted(p.name for p in run.iterdir()) == []  # no marker, no temporary file
    outputs.check_replaceable(run, "run")  # a new run may go there
    outputs.claim(run, "run")
    assert outputs.marker(run)["kind"] == "run"


def test_a_stage_whose_marker_cannot_be_written_is_not_left_behind(tmp_path):
    """Unmarked, remove_stale_temps never took it away: one more .OUT.tmp-* per failed run."""
    out = tmp_path / "features"
    proc = in_a_subprocess_limited_to(20, f"""
        from pathlib import Path
        from hvd_ctsm.files import outputs
        outputs.staging_dir(Path({str(out)!r}), overwrite=False)
    """)
    assert proc.returncode != 0 and "File too large" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_config_cut_short_keeps_the_one_before(tmp_path):
    """config.yaml is written at every start, --resume's too: cut short it was empty, and
    the next --resume trained on the defaults while saying it used the run's settings."""
    from hvd_ctsm.config import load_config, save_config

    saved = tmp_path / "config.yaml"
    save_config(load_config(None, ["model.dim=32", "epochs=3"]), saved)
    before = saved.read_bytes()
    proc = in_a_subprocess_limited_to(100, f"""
        from pathlib import Path
        from hvd_ctsm.config import load_config, save_config
        save_config(load_config(None, ["model.dim=32", "epochs=4"]), Path({str(saved)!r}))
    """)
    assert proc.returncode != 0 and str(saved) in proc.stderr  # the error names the file
    assert saved.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # no temporary file left


def test_resume_refuses_an_empty_config_rather_than_train_on_the_defaults(tmp_path):
    """One left by an earlier version, or a copy cut short."""
    from hvd_ctsm.train.launch import parse_command

    run = tmp_path / "run"
    outputs.claim(run, "run")
    (run / "config.yaml").write_text("")
    with pytest.raises(SystemExit, match=r"config.yaml is empty .* --config FILE"):
        parse_command(["--data", str(tmp_path / "data"), "--out", str(run), "--resume"])


def test_a_full_disk_in_a_thread_is_its_line_and_exit_3_though_the_command_ended(capsys):
    """A thread's full disk (TensorBoard's writer) was said as "error: ..." while the command
    exited 0: a scheduler saw a success."""
    import threading

    def main(argv):
        thread = threading.Thread(target=raise_a_full_disk)
        thread.start()
        thread.join()
        return 0

    assert run_cli(main, "hvd-ctsm step", []) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hvd-ctsm step: error: no space left"), err


def raise_a_full_disk():
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "run/events.out")


def test_the_full_disk_error_crosses_processes_whole():
    """It could not be unpickled (multiprocessing and joblib send errors so)."""
    import pickle

    from hvd_ctsm.errors import NoSpaceError

    full = NoSpaceError.of(OSError(errno.ENOSPC, "No space left on device"), "run", "resume it")
    back = pickle.loads(pickle.dumps(full))
    assert (back.errno, back.filename, back.then) == (errno.ENOSPC, "run", "resume it")


def test_a_new_report_inside_a_dataset_is_told_to_go_elsewhere(tmp_path):
    """backtest --report FEATURES/r.json was told to "copy the report out of it", a report
    not yet written."""
    from hvd_ctsm.evaluation.gate import check_report_path

    outputs.mark(tmp_path, "features")
    with pytest.raises(outputs.UnsafeOutputError, match="write the report outside it"):
        check_report_path(tmp_path / "r.json")


def test_an_error_raised_while_handling_a_full_disk_is_its_own(capsys):
    """A bug raised `from None` while a full disk was being handled was said as the full disk
    (no "crashed", no --debug to find it)."""
    def main(argv):
        try:
            raise_a_full_disk()
        except OSError:
            raise RuntimeError("a bug") from None

    assert run_cli(main, "hvd-ctsm step", []) == 3
    assert "crashed: RuntimeError: a bug" in capsys.readouterr().err


def test_a_json_line_that_does_not_fit_is_cut_back_off(tmp_path):
    """The trainer's metrics.jsonl, train_log.jsonl and events.jsonl: a record cut short by a
    full disk stayed torn, and a resumed run appended after it (a reader of JSON lines stops)."""
    log = tmp_path / "metrics.jsonl"
    proc = in_a_subprocess_limited_to(40, f"""
        from hvd_ctsm.files.atomic import append_line
        append_line({str(log)!r}, '{{"epoch": 1}}')
        append_line({str(log)!r}, '{{"epoch": 2, "ndcg@10": 0.123456789}}')
    """)
    assert proc.returncode != 0 and f"File too large: '{log}'" in proc.stderr, proc.stderr
    assert log.read_text() == '{"epoch": 1}\n'


def test_a_line_an_earlier_run_left_torn_is_cut_before_the_next(tmp_path):
    from hvd_ctsm.files.atomic import append_line

    log = tmp_path / "train_log.jsonl"
    log.write_text('{"step": 1}\n{"step": 2, "lo')  # killed mid-write
    append_line(log, '{"step": 3}')
    assert log.read_text() == '{"step": 1}\n{"step": 3}\n'
    log.write_text('{"st')  # torn with no line before it
    append_line(log, '{"step": 4}\n')
    append_line(log, '{"step": 5}')
    assert log.read_text() == '{"step": 4}\n{"step": 5}\n'
