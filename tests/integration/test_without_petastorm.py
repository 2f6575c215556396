"""Datasets without Petastorm: the feature job writes the same files with it or without it, and
the whole chain (features, training, backtest) runs in processes where it cannot be imported, as
on current stacks (pyarrow >= 15), where Petastorm 0.13 does not run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_ctsm.data.batches import open_reader, split_url
from tests.conftest import REPO, TINY_SOURCE
from tests.integration.test_arrow_reader import assert_same_rows

pytestmark = pytest.mark.spark


def test_both_writers_write_the_same_files(spark, tmp_path, monkeypatch):
    from spark_jobs.build_features import build_features
    from spark_jobs.config import FeatureConfig

    outs = {}
    for writer in ("auto", "parquet"):
        monkeypatch.setenv("HVD_CTSM_WRITER", writer)
        outs[writer] = tmp_path / writer
        build_features(spark, FeatureConfig(source=TINY_SOURCE, out=str(outs[writer]),
                                            max_len=40, row_groups=8))
    for split in ("train", "validation", "test", "serving"):
        with_petastorm, without = outs["auto"] / split, outs["parquet"] / split
        names = sorted(p.name for p in with_petastorm.glob("*.parquet"))
        assert names and names == sorted(p.name for p in without.glob("*.parquet"))
        for name in names:
            assert (with_petastorm / name).read_bytes() == (without / name).read_bytes(), name
        assert common_metadata(without) == common_metadata(with_petastorm)
    # Petastorm's own reader reads the dataset written without it: the same rows as ours.
    url = split_url(outs["parquet"], "train")
    for reader in ("petastorm", "arrow"):
        monkeypatch.setenv("HVD_CTSM_READER", reader)
        with open_reader(url, 1, 2, seed=3, shuffle=True) as rows:
            outs[reader] = [row._asdict() for row in rows]
    assert_same_rows(outs["arrow"], outs["petastorm"])


def common_metadata(split: Path) -> tuple:
    """What Petastorm's readers take from _common_metadata: the schema, the Unischema (the same
    pickle as make_schema's) and the row groups of each file."""
    import pickle

    import pyarrow.parquet as pq

    from hvd_ctsm.data.petastorm_metadata import ROW_GROUPS_KEY, UNISCHEMA_KEY
    from hvd_ctsm.data.schema import make_schema

    meta = pq.read_metadata(split / "_common_metadata")
    values = meta.metadata
    assert values[UNISCHEMA_KEY] == pickle.dumps(make_schema())
    spark_schema = values[b"org.apache.spark.sql.parquet.row.metadata"]
    return (meta.schema.to_arrow_schema().remove_metadata(), values[UNISCHEMA_KEY],
            json.loads(values[ROW_GROUPS_KEY]), spark_schema)


def blocking_petastorm(folder: Path) -> dict:
    """An environment whose Python processes (Spark's workers included) cannot import Petastorm
    or Horovod: a sitecustomize that makes their imports fail."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        "import sys\nfor name in ('petastorm', 'horovod'):\n    sys.modules[name] = None\n")
    path = os.pathsep.join([str(folder), str(REPO), os.environ.get("PYTHONPATH", "")])
    return os.environ | {"PYTHONPATH": path, "PYTHONWARNINGS": "ignore"}


def run(cmd: list[str], env: dict, timeout: float = 600) -> str:
    proc = subprocess.run([sys.executable, *cmd], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.mark.slow
def test_features_train_and_backtest_run_where_petastorm_cannot_be_imported(tmp_path):
    env = blocking_petastorm(tmp_path / "site")
    failed = subprocess.run([sys.executable, "-c", "import petastorm"], env=env,
                            capture_output=True, text=True)
    assert failed.returncode != 0 and "ModuleNotFoundError" in failed.stderr  # the block works
    data, model, report = tmp_path / "data", tmp_path / "model", tmp_path / "report.json"
    run(["-m", "spark_jobs.build_features", "--source", TINY_SOURCE, "--out", str(data),
         "--max-len", "40", "--row-groups", "8", "--master", "local[2]"], env)
    assert (data / "train" / "_common_metadata").exists()  # written by our own code
    log = run(["-m", "hvd_ctsm.train", "--data", str(data), "--out", str(model), "--epochs", "1",
               "tracking.enabled=false"], env)
    assert "backend=horovod" not in log  # Horovod could not be imported either
    run(["-m", "hvd_ctsm", "backtest", "--data", str(data), "--model", str(model),
         "--report", str(report)], env)
    metrics = json.loads(report.read_text())["model"]["full"]
    assert metrics["targets"] > 0 and 0 <= metrics["ndcg@10"] <= 1
