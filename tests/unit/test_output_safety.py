"""--overwrite never deletes what we did not create; stale temp folders of killed jobs go.

Real commands on real folders: the trainer's and the feature job's entry points, a real dataset
written by the feature job, real files that must survive.
This file holds the unit-tier part; the rest is in tests/integration/test_output_safety.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hvd_ctsm.files import outputs
from tests.conftest import REPO


def test_a_folder_without_our_marker_is_never_replaced(tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    with pytest.raises(outputs.UnsafeOutputError, match="not written by hvd_ctsm"):
        outputs.check_replaceable(precious, "run")
    outputs.mark(precious, "features")
    with pytest.raises(outputs.UnsafeOutputError, match="holds hvd_ctsm features output"):
        outputs.check_replaceable(precious, "run")
    outputs.check_replaceable(precious, "features")  # ours, same kind: may go
    with pytest.raises(outputs.UnsafeOutputError, match="lies inside the input"):
        outputs.check_replaceable(tmp_path, "features", [precious / "notes.txt"])
    assert (precious / "notes.txt").read_text() == "mine"


def test_a_run_folder_of_ours_is_removed_marker_last(tmp_path):
    run = tmp_path / "run"
    outputs.claim(run, "run")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "step-1.pt").write_bytes(b"x")
    (run / "model.pt").write_bytes(b"y")
    outputs.check_replaceable(run, "run")
    outputs.remove_ours(run)
    assert not run.exists() and outputs.is_empty(run)


@pytest.mark.parametrize("flag", [[], ["--overwrite"], ["--resume"]])
def test_train_into_a_folder_we_did_not_write_refuses(tmp_path, flag):
    """With --resume too: it used to train into the folder and mark it ours, so that a later
    --overwrite removed the user's files."""
    out = tmp_path / "not-a-run"
    out.mkdir()
    (out / "report.docx").write_bytes(b"years of work")
    proc = subprocess.run([sys.executable, "-m", "hvd_ctsm.train", "--data", str(tmp_path / "data"),
                           "--out", str(out), *flag], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "not written by hvd_ctsm" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["report.docx"]
    assert (out / "report.docx").read_bytes() == b"years of work"


def test_staged_publishes_on_success_and_keeps_the_old_output_on_failure(tmp_path):
    out = tmp_path / "scores"
    with outputs.staged(out, overwrite=False, kind="scores") as stage:
        (stage / "part-0").write_text("first")
    assert (out / "part-0").read_text() == "first" and outputs.marker(out)["kind"] == "scores"
    with pytest.raises(KeyboardInterrupt):
        with outputs.staged(out, overwrite=True, kind="scores") as stage:
            (stage / "part-0").write_text("half")
            raise KeyboardInterrupt
    assert (out / "part-0").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["scores"]  # the stage is gone
    with pytest.raises(outputs.UnsafeOutputError):  # checked before the body runs
        with outputs.staged(out, overwrite=True, kind="features"):
            raise AssertionError("the body must not run")


def test_ctrl_c_during_the_swap_waits_for_it_to_end(tmp_path, monkeypatch):
    """publish moves OUT aside, then the stage in: a KeyboardInterrupt between the two left OUT
    nowhere (only a hidden .old folder). Ctrl-C there is held until the swap is done."""
    import os
    import signal

    out, stage = tmp_path / "out", tmp_path / ".out.tmp-1"
    out.mkdir()
    (out / "old.txt").write_text("old")
    stage.mkdir()
    (stage / "new.txt").write_text("new")
    replace = os.replace

    def pressed_midway(src, dst):  # Ctrl-C right after OUT was moved aside
        replace(src, dst)
        if src == out:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(outputs.os, "replace", pressed_midway)
    # Python's own Ctrl-C, whatever this process inherited (a shell's background job ignores
    # SIGINT, and publish then leaves it ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            outputs.publish(stage, out)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (out / "new.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


SIGTERM_MIDWAY = """
import os, signal, sys
from pathlib import Path
from hvd_ctsm.files import outputs
out, stage = Path(sys.argv[1]) / "out", Path(sys.argv[1]) / ".out.tmp-1"
replace = os.replace
def sent_midway(src, dst):  # a scheduler's SIGTERM right after OUT was moved aside
    replace(src, dst)
    if Path(src) == out:
        os.kill(os.getpid(), signal.SIGTERM)
outputs.os.replace = sent_midway
if sys.argv[2] == "handled":  # as spark_session's handler: a stop raised
    from hvd_ctsm.errors import Terminated
    def stop(signum, frame):
        raise Terminated("stopped by SIGTERM")
    signal.signal(signal.SIGTERM, stop)
try:
    outputs.publish(stage, out)
except KeyboardInterrupt:  # Terminated is one
    sys.exit(143)
print("went on")
"""


@pytest.mark.parametrize("handler", ["default", "handled"])
def test_sigterm_during_the_swap_waits_for_it_to_end(tmp_path, handler):
    """A SIGTERM between the swap's two renames left OUT nowhere (the process ended there; with
    spark_session's handler, its stop discarded the stage), and the next run removed the old
    output aside as a killed run's temp. It is held until the swap is done, then does what it
    would have: the process ends by it, or the handler's stop is raised."""
    out, stage = tmp_path / "out", tmp_path / ".out.tmp-1"
    out.mkdir()
    (out / "old.txt").write_text("old")
    stage.mkdir()
    (stage / "new.txt").write_text("new")
    ran = subprocess.run([sys.executable, "-c", SIGTERM_MIDWAY, str(tmp_path), handler],
                         capture_output=True, text=True, cwd=REPO, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert ran.returncode == (-15 if handler == "default" else 143), ran.stderr
    assert "went on" not in ran.stdout
    assert (out / "new.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_nothing_is_written_inside_a_dataset_or_a_registry(tmp_path):
    """`score --out feat2/serving/new.parquet` wrote into another dataset, exit 0; that dataset
    was then refused as damaged. A run, a scores folder or a file there is refused first."""
    from hvd_ctsm.evaluation.gate import check_report_place
    from hvd_ctsm.serving.score import check_score_file

    data, registry = tmp_path / "feat2", tmp_path / "registry"
    for folder, whole in ((data, "feature dataset"), (registry, "model registry")):
        (folder / "part").mkdir(parents=True)
        outputs.mark(folder, "features" if folder == data else "registry")
        with pytest.raises(outputs.UnsafeOutputError, match=f"inside the {whole} {folder}"):
            check_score_file(folder / "part" / "new.parquet", ())
        with pytest.raises(outputs.UnsafeOutputError, match=f"inside the {whole} {folder}"):
            outputs.check_replaceable(folder / "run", "run")
        with pytest.raises(outputs.UnsafeOutputError, match=f"inside the {whole} {folder}"):
            check_report_place(folder / "part" / "backtest.json")  # backtest and gate --report
    check_score_file(tmp_path / "scores.parquet", ())  # beside them: fine
    outputs.check_replaceable(tmp_path / "run", "run")
    outputs.check_replaceable(data, "features")  # the dataset itself: its own job replaces it


def test_a_registry_from_before_markers_is_known_by_its_current_and_versions(tmp_path):
    """deploy marked no registry before 2026-11-30: such a registry (`current` naming one of its
    versions) is refused as a place to write, as a marked one is; a user's folder that only has
    a file named `current` is not taken for one."""
    registry = tmp_path / "registry"
    (registry / "v0001").mkdir(parents=True)
    (registry / "current").write_text("v0001\n")
    with pytest.raises(outputs.UnsafeOutputError,
                       match=f"inside the model registry {registry}, whose"):
        outputs.check_replaceable(registry / "v0001" / "run", "run")
    (registry / "current").write_text("notes I keep\n")
    outputs.check_replaceable(registry / "v0001" / "run", "run")


def test_a_file_that_cannot_be_written_is_named_not_its_temporary_file():
    """`backtest --report /proc/r.json` said "/proc/.r.json.rvgmaky9.tmp not found; check the
    path": a name the user never typed. (/proc: even root cannot create files there.)"""
    from hvd_ctsm.errors import one_line
    from hvd_ctsm.files.atomic import atomic_write_bytes

    with pytest.raises(PermissionError) as refused:
        atomic_write_bytes("/proc/r.json", b"{}")
    assert refused.value.filename == "/proc/r.json"
    assert one_line(refused.value).startswith("cannot write or read /proc/r.json")


def test_a_registry_whose_current_version_is_gone_says_so(tmp_path):
    """REGISTRY/current naming a missing v0007 was "a folder without `current`"."""
    from hvd_ctsm.serving.score import ScoringError, resolve_model

    registry = tmp_path / "registry"
    registry.mkdir()
    with pytest.raises(ScoringError, match="a folder without `current`"):
        resolve_model(registry)
    (registry / outputs.CURRENT).write_text("v0007\n")
    with pytest.raises(ScoringError, match="its `current` names v0007, which holds no model.pt"):
        resolve_model(registry)
