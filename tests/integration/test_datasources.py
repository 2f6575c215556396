"""Inputs and outputs where the data lives: a catalog table as the feature job's source, bad
sources refused in one line, and a feature dataset on an S3-compatible server (moto, started by
the test on 127.0.0.1) read by the real trainer at two ranks (horovodrun; torchrun where
Horovod is not installed), with the scores written back.

What this machine cannot do, and so is not tested here: Spark reading or writing s3a:// itself
(PySpark ships no hadoop-aws jars and there is no Maven access to fetch them), delta: reads (no
Delta Lake jars, same reason), hdfs:// (no Hadoop cluster). The feature job therefore reaches S3
the way it does on any driver: it builds locally and uploads through fsspec (s3fs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from spark_jobs.build_features import build_features, main
from spark_jobs.config import FeatureConfig
from tests.helpers import faultlib as fl

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.both_stacks]

COLUMNS = ("client_id", "item_id", "timestamp", "event_type", "value")


def event_rows() -> list[tuple]:
    """40 clients x 12 ratings, distinct timestamps per client (no tie rule involved)."""
    rows = []
    for client in range(40):
        for n in range(12):
            item = (client * 7 + n * 5) % 35
            rows.append((f"c{client}", f"i{item}", 1_600_000_000 + client * 50_000 + n * 3_600,
                         "rating", float(1 + (client + n) % 5)))
    return rows


def split_rows(out: Path) -> dict:
    """{split: rows as dicts, sorted}: every column, the encoded arrays as their bytes."""
    splits = {}
    for split in ("train", "validation", "test", "serving"):
        rows = pq.read_table(out / split).to_pylist()
        splits[split] = sorted(rows, key=lambda r: (r["client_id"], r["timestamp"],
                                                    r["target_time"]))
    return splits


def test_a_catalog_table_gives_the_features_its_rows_give_as_csv(spark, tmp_path, capsys):
    rows = event_rows()
    csv = tmp_path / "events.csv"
    csv.write_text("\n".join([",".join(COLUMNS)] + [",".join(str(v) for v in r) for r in rows])
                   + "\n")
    # A managed table: its database lives in a warehouse folder under tmp_path, the table's
    # files are the catalog's (saveAsTable), typed as a real table would be.
    spark.sql(f"CREATE DATABASE ctsm_ds LOCATION '{(tmp_path / 'warehouse').as_uri()}'")
    try:
        frame = spark.createDataFrame(rows, "client_id string, item_id string, timestamp long, "
                                            "event_type string, value double")
        frame.write.saveAsTable("ctsm_ds.events")
        assert spark.catalog.getTable("ctsm_ds.events").tableType == "MANAGED"

        build_features(spark, FeatureConfig(source=f"events:{csv}", out=str(tmp_path / "csv"),
                                             max_len=8, row_groups=2))
        assert main(["--source", "table:ctsm_ds.events", "--out", str(tmp_path / "table"),
                     "--max-len", "8", "--row-groups", "2"]) == 0
    finally:
        spark.sql("DROP DATABASE IF EXISTS ctsm_ds CASCADE")
    capsys.readouterr()
    from_csv, from_table = split_rows(tmp_path / "csv"), split_rows(tmp_path / "table")
    assert len(from_csv["serving"]) == 40 and len(from_csv["train"]) > 0
    assert from_table == from_csv
    vocab = [(tmp_path / name / "vocab.json").read_bytes() for name in ("table", "csv")]
    assert vocab[0] == vocab[1]
    meta = json.loads((tmp_path / "table/metadata.json").read_text())
    assert meta["source"] == "table:ctsm_ds.events" and meta["counts"]["used"] == len(rows)


@pytest.mark.parametrize("source, says", [
    ("table:no_such_db.no_such_table", "no table 'no_such_db.no_such_table'"),
    ("delta:{tmp}/events", "Delta Lake jars"),
    ("events:s3a://bucket/events.csv", "no filesystem for s3a://"),
    ("events:nosuch://bucket/events.csv", "no filesystem for nosuch://"),
    ("events:file://{tmp}/missing.csv", "no such file or folder"),
    ("events:{tmp}/empty", "no CSV (*.csv) or Parquet files in"),  # was Spark's crash, exit 3
])
def test_a_source_spark_cannot_read_is_one_line_and_exit_2(spark, tmp_path, capsys, source, says):
    (tmp_path / "empty").mkdir()
    code = main(["--source", source.format(tmp=tmp_path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and says.lower() in err.lower(), err
    assert not (tmp_path / "out").exists()


def test_an_output_url_of_no_known_scheme_is_one_line_and_exit_2(spark, tmp_path, capsys):
    code = main(["--source", "synthetic:clients=20,items=10,events=300,seed=1",
                 "--out", "nosuch://bucket/features"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "nosuch://" in err, err


@pytest.fixture(scope="module")
def s3():
    """A local S3-compatible server (moto, 127.0.0.1, a free port) and the AWS settings that
    point boto/s3fs at it, for this process and the processes it starts."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    settings = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "test",
                "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir("ctsm")
    yield fs
    server.stop()
    for key, value in saved.items():
        os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    s3fs.S3FileSystem.clear_instance_cache()


def test_features_on_s3_train_on_two_ranks_and_score_back_to_s3(spark, s3, tmp_path, capsys):
    from hvd_ctsm.serving import score
    url = "s3://ctsm/features"
    summary = build_features(spark, FeatureConfig(
        source="synthetic:clients=60,items=30,events=1500,seed=5", out=url, max_len=20,
        row_groups=2))
    assert summary["out"] == url
    assert s3.isfile("ctsm/features/metadata.json") and len(s3.ls("ctsm/features/train")) >= 2
    assert main(["--source", "synthetic:clients=20,items=10,events=300,seed=1",  # never replaced
                 "--out", url, "--overwrite"]) == 2
    assert "never replaced" in capsys.readouterr().err

    run = tmp_path / "run"
    proc = subprocess.run(
        [*fl.two_ranks(), sys.executable, "-m", "hvd_ctsm.train", "--data", url,
         "--out", str(run), "--epochs", "1", "data.batch_size=16", "model.dim=16",
         "model.layers=1", "progress=false"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    trained = json.loads((run / "train_summary.json").read_text())
    assert trained["ranks"] == 2 and trained["steps_per_epoch"] > 0
    checksums = trained["parameter_checksums"]
    assert checksums[0] == checksums[1]  # both ranks read their shard from S3 and stayed in sync

    out = "s3://ctsm/scores/top5.parquet"
    assert score.main(["--data", url, "--model", str(run), "--out", out, "--k", "5"]) == 0
    with s3.open("ctsm/scores/top5.parquet", "rb") as f:
        remote = pq.read_table(f)
    assert s3.ls("ctsm/scores") == ["ctsm/scores/top5.parquet"]  # no temporary object left
    # The same model on a local copy of the same dataset scores the same.
    s3.get("ctsm/features", str(tmp_path / "copy"), recursive=True)
    assert score.main(["--data", str(tmp_path / "copy"), "--model", str(run),
                       "--out", str(tmp_path / "top5.parquet"), "--k", "5"]) == 0
    assert len(set(remote.column("client_id").to_pylist())) == summary["counts"]["clients"] > 0
    assert remote.equals(pq.read_table(tmp_path / "top5.parquet"))

    # The backtest reads the test split from S3 and measures what it measures on the copy.
    from hvd_ctsm.evaluation import backtest
    reports = {name: run_backtest_report(backtest, data, run, tmp_path / f"{name}.json")
               for name, data in (("s3", url), ("copy", str(tmp_path / "copy")))}
    assert reports["s3"]["model"]["full"]["targets"] > 0
    assert reports["s3"]["model"] == reports["copy"]["model"]


def run_backtest_report(backtest, data: str, run: Path, report: Path) -> dict:
    assert backtest.main(["--data", data, "--model", str(run), "--report", str(report)]) == 0
    return json.loads(report.read_text())


def test_an_unreachable_or_missing_dataset_url_is_one_line_and_exit_2(s3, tmp_path, capsys,
                                                                      monkeypatch):
    from hvd_ctsm.errors import run_cli
    from hvd_ctsm.serving import score

    argv = ["--data", "s3://ctsm/no-such-features", "--model", str(tmp_path / "model"),
            "--out", str(tmp_path / "s.parquet")]
    assert run_cli(score.main, "hvd_ctsm.serving.score", argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "s3://ctsm/no-such-features" in err, err

    import s3fs

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        assert run_cli(score.main, "hvd_ctsm.serving.score", argv) == 2
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot reach s3://ctsm/no-such-features" in err, err
