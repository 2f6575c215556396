"""--overwrite never deletes what we did not create; stale temp folders of killed jobs go.

Real commands on real folders: the trainer's and the feature job's entry points, a real dataset
written by the feature job, real files that must survive.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_ctsm.files import outputs
from hvd_ctsm.train import launch
from spark_jobs.build_features import main as features_main

REPO = Path(__file__).resolve().parents[1]
SMALL = "synthetic:clients=60,items=30,events=1500,seed=3"


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


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


def test_train_overwrite_of_the_dataset_refuses_and_keeps_it(tiny_features, tmp_path):
    data = tmp_path / "features"
    shutil.copytree(tiny_features, data)
    before = tree(data)
    for out in (data, tmp_path):  # the dataset itself, and a folder holding it
        with pytest.raises(SystemExit) as stop:
            launch.main(["--data", str(data), "--out", str(out), "--overwrite"])
        assert str(stop.value).startswith("error: refusing to write") and str(data) in str(
            stop.value)
    assert tree(data) == before


def test_train_overwrite_of_a_folder_we_did_not_write_refuses(tmp_path):
    out = tmp_path / "not-a-run"
    out.mkdir()
    (out / "report.docx").write_bytes(b"years of work")
    proc = subprocess.run([sys.executable, "-m", "hvd_ctsm.train", "--data", str(tmp_path / "data"),
                           "--out", str(out), "--overwrite"], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "not written by hvd_ctsm" in proc.stderr
    assert (out / "report.docx").read_bytes() == b"years of work"


@pytest.mark.spark
def test_features_overwrite_of_the_folder_holding_the_input_refuses(spark, tmp_path, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    events = raw / "events.csv"
    events.write_text("client_id,item_id,timestamp,event_type,value\nc1,i1,1600000000,view,\n")
    for out in (raw, tmp_path):
        code = features_main(["--source", f"events:{events}", "--out", str(out), "--overwrite",
                              "--master", "local[2]"])
        assert code == 2
        assert "lies inside the input" in capsys.readouterr().err
    assert events.read_text().startswith("client_id,item_id")


@pytest.mark.spark
def test_stale_temp_folders_of_killed_runs_are_removed_but_nothing_else(spark, tmp_path):
    out = tmp_path / "features"
    killed = tmp_path / f".{out.name}.tmp-deadbeef"
    killed.mkdir()
    (killed / "part-00000.parquet").write_bytes(b"half")
    (killed / outputs.MARKER).write_text(json.dumps(
        {"kind": "features", "host": os.uname().nodename, "pid": 2**22 + 12345, "created": 0}))
    foreign = tmp_path / f".{out.name}.tmp-notours1"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("x")
    running = outputs.staging_dir(out, overwrite=False)  # a concurrent job's: this process, alive
    assert features_main(["--source", SMALL, "--out", str(out), "--row-groups", "2",
                          "--max-len", "10", "--master", "local[2]"]) == 0
    assert not killed.exists() and (foreign / "keep.txt").exists() and running.exists()
    assert outputs.marker(out)["kind"] == "features"
    outputs.discard(running)
    assert features_main(["--source", SMALL, "--out", str(out), "--row-groups", "2",
                          "--max-len", "10", "--master", "local[2]", "--overwrite"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(f".{out.name}")) == [
        foreign.name]


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
