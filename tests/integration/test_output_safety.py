"""--overwrite never deletes what we did not create; stale temp folders of killed jobs go.

Real commands on real folders: the trainer's and the feature job's entry points, a real dataset
written by the feature job, real files that must survive.
The unit-tier part is in tests/unit/test_output_safety.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hvd_ctsm.files import outputs
from hvd_ctsm.train import launch
from spark_jobs.build_features import main as features_main

pytestmark = pytest.mark.both_stacks

SMALL = "synthetic:clients=60,items=30,events=1500,seed=3"


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


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
