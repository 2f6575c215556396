"""A damaged or incomplete dataset is refused by every reader, with one line naming the file.

A real dataset written by the feature job, one of its real Parquet files deleted or changed, and
the real commands (trainer, backtest, scoring) run as a user runs them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_ctsm.data.batches import DatasetError, split_url, verify_split
from tests.conftest import REPO

pytestmark = pytest.mark.both_stacks


def run_module(module: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})


@pytest.fixture
def damaged(tiny_features, tmp_path) -> tuple[Path, Path]:
    """A copy of the dataset with one Parquet file of each split deleted; (dataset, a file)."""
    data = tmp_path / "damaged"
    shutil.copytree(tiny_features, data)
    gone = None
    for split in ("train", "test", "serving"):
        gone = sorted((data / split).glob("*.parquet"))[1]
        gone.unlink()
    return data, gone


def test_metadata_lists_every_file_with_rows_and_bytes(tiny_features):
    meta = json.loads((tiny_features / "metadata.json").read_text())
    for name, split in meta["splits"].items():
        files = split["files"]
        assert [f["name"] for f in files] == sorted(
            p.name for p in (tiny_features / name).glob("*.parquet"))
        assert sum(f["rows"] for f in files) == split["rows"]
        assert all(f["bytes"] == (tiny_features / name / f["name"]).stat().st_size for f in files)
        verify_split(tiny_features, name)  # intact: passes


@pytest.mark.parametrize("command", [
    ("hvd_ctsm.train", "--data", "{data}", "--out", "{tmp}/run", "--epochs", "1"),
    ("hvd_ctsm.evaluation.backtest", "--data", "{data}", "--model", "{tmp}/no-model", "--report",
     "{tmp}/r.json"),
    ("hvd_ctsm.serving.score", "--data", "{data}", "--model", "{tmp}/no-model",
     "--out", "{tmp}/s.pq"),
])
def test_a_missing_parquet_file_is_refused_in_one_line(damaged, tmp_path, command):
    data, gone = damaged
    module, *args = (a.format(data=data, tmp=tmp_path) for a in command)
    proc = run_module(module, *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-2000:]
    assert "is missing" in lines[0] and "rebuild the features" in lines[0]
    assert f"/{gone.name} is missing" in lines[0]  # the same file deleted from each split
    assert not (tmp_path / "s.pq").exists() and not (tmp_path / "r.json").exists()


def test_a_changed_or_extra_file_is_refused(tiny_features, tmp_path):
    data = tmp_path / "changed"
    shutil.copytree(tiny_features, data)
    first = sorted((data / "validation").glob("*.parquet"))[0]
    with first.open("ab") as f:
        f.write(b"\0")
    with pytest.raises(DatasetError, match="changed since it was written"):
        split_url(data, "validation")
    shutil.copyfile(sorted((data / "test").glob("*.parquet"))[0], data / "test" / "zz.parquet")
    with pytest.raises(DatasetError, match="does not list"):
        split_url(data, "test")
