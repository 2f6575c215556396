"""hvd_ctsm.files.storage on fsspec's in-memory filesystem (a real fsspec filesystem, no server)
and on
local paths: uploads put metadata.json last and take back what they put when they fail, remote
writes leave no temporary object, and a scheme no filesystem serves is one StorageError."""

from __future__ import annotations

import fsspec
import pytest

from hvd_ctsm.files import storage


@pytest.fixture
def memory():
    fs = fsspec.filesystem("memory")  # one instance per process: storage gets this one too
    if fs.exists("/ds"):
        fs.rm("/ds", recursive=True)
    yield fs
    if fs.exists("/ds"):
        fs.rm("/ds", recursive=True)


def dataset_folder(tmp_path):
    folder = tmp_path / "features"
    (folder / "train").mkdir(parents=True)
    (folder / "train" / "part-00000.parquet").write_bytes(b"rows")
    (folder / "vocab.json").write_bytes(b"{}")
    (folder / "metadata.json").write_bytes(b'{"schema_version": 1}')
    return folder


def test_an_upload_puts_metadata_last_and_everything_else_before(tmp_path, memory, monkeypatch):
    order = []
    put = memory.put_file
    monkeypatch.setattr(memory, "put_file", lambda src, dst, **kw: (order.append(dst),
                                                                     put(src, dst, **kw)))
    storage.upload_folder(dataset_folder(tmp_path), "memory://ds/features", last="metadata.json")
    assert order[-1].endswith("/metadata.json") and len(order) == 3
    assert storage.read_bytes("memory://ds/features/vocab.json") == b"{}"
    assert storage.parquet_sizes("memory://ds/features/train") == {"part-00000.parquet": 4}
    assert storage.is_dir("memory://ds/features") and not storage.exists("memory://ds/other")


def test_a_failed_upload_removes_what_it_put_and_nothing_else(tmp_path, memory, monkeypatch):
    memory.pipe_file("/ds/features-neighbour/keep.txt", b"not ours")
    put, calls = memory.put_file, []

    def fail_on_the_second(src, dst, **kw):  # fault injection: the store goes away mid-upload
        calls.append(dst)
        if len(calls) == 2:
            raise ConnectionError("connection reset")
        put(src, dst, **kw)

    monkeypatch.setattr(memory, "put_file", fail_on_the_second)
    with pytest.raises(storage.StorageError, match="cannot reach memory://ds/features"):
        storage.upload_folder(dataset_folder(tmp_path), "memory://ds/features",
                              last="metadata.json")
    assert not memory.find("/ds/features")  # nothing of the partial upload is left
    assert memory.cat_file("/ds/features-neighbour/keep.txt") == b"not ours"


def test_a_remote_write_is_whole_and_leaves_no_temporary_object(memory):
    storage.write_bytes_atomic("memory://ds/scores/top.parquet", b"scores")
    assert memory.ls("/ds/scores", detail=False) == ["/ds/scores/top.parquet"]
    assert storage.read_bytes("memory://ds/scores/top.parquet") == b"scores"


def test_schemes_paths_and_errors(tmp_path):
    assert storage.is_remote("s3://b/k") and storage.is_remote("dbfs:/x")
    assert not storage.is_remote(str(tmp_path)) and not storage.is_remote(tmp_path.as_uri())
    assert storage.local_path((tmp_path / "a b").as_uri()) == tmp_path / "a b"
    assert storage.join("s3://b/ds/", "train") == "s3://b/ds/train"
    assert storage.join(tmp_path.as_uri(), "train") == str(tmp_path / "train")
    with pytest.raises(storage.StorageError, match=r"no filesystem for nosuch:// URLs"):
        storage.exists("nosuch://bucket/features")
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("memory://ds/absent.json")


@pytest.mark.parametrize("written, taken", [
    ("dbfs:/Volumes/main/recsys/ctsm/features", "/Volumes/main/recsys/ctsm/features"),
    ("dbfs:///Volumes/main/recsys/ctsm", "/Volumes/main/recsys/ctsm"),
    ("DBFS:/Volumes/main/recsys/ctsm", "/Volumes/main/recsys/ctsm"),
    ("dbfs:/ctsm/run", "/dbfs/ctsm/run"),
    ("/Volumes/main/recsys/ctsm", "/Volumes/main/recsys/ctsm"),
    ("s3://bucket/features", "s3://bucket/features"),
    ("models:/main.recsys.ctsm@champion", "models:/main.recsys.ctsm@champion"),
    ("runs/demo", "runs/demo"),
])
def test_databricks_locations_take_the_local_route(written, taken):
    assert storage.location(written) == taken
    assert storage.location(taken) == taken  # idempotent
    if written.lower().startswith("dbfs:"):
        assert not storage.is_remote(taken)


def test_every_command_takes_a_volume_uri_as_its_local_path(tmp_path, capsys):
    """A dbfs:/Volumes/... option reaches the command as /Volumes/...: here nothing is there, so
    the one-line error names that path (not an unknown 'dbfs' scheme)."""
    from hvd_ctsm import cli
    from hvd_ctsm.errors import run_cli

    volume = "dbfs:/Volumes/main/recsys/nowhere"
    code = run_cli(cli.main, "hvd-ctsm", ["backtest", "--data", f"{volume}/features", "--model",
                                         f"{volume}/run", "--report", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 2 and "/Volumes/main/recsys/nowhere/" in err and "dbfs" not in err, err


@pytest.mark.parametrize("argv, option", [
    (["backtest", "--data", "s3://b/features", "--model", "run", "--report", "s3://b/r.json"],
     "--report"),
    (["backtest", "--data", "features", "--model", "s3://b/run", "--report", "r.json"], "--model"),
    (["gate", "--report", "s3://b/r.json", "--gate", "mrr>0"], "--report"),
    (["deploy", "--model", "run", "--report", "r.json", "--registry", "foo://x/reg"],
     "--registry"),
    (["deploy", "--model", "s3://b/run", "--report", "r.json", "--registry", "reg"], "--model"),
    (["train", "--data", "features", "--out", "s3://b/run"], "--out"),
    (["train", "--data", "features", "--out", "run", "--init-from", "s3://b/run"],
     "--init-from"),
    (["pipeline", "--source", "synthetic:clients=10", "--work", "w", "--registry", "s3://b/r",
      "--gate", "mrr>0"], "--registry"),
    # A model option: a URL was taken as a path, said missing after the data was opened (and
    # Spark started), or "s3:/b/reg not found" for --champion
    (["score", "--data", "features", "--model", "s3://b/reg", "--out", "s.parquet"], "--model"),
    (["backtest", "--data", "features", "--model", "run", "--report", "r.json", "--champion",
      "s3://b/reg"], "--champion"),
    (["backtest", "--data", "features", "--model", "run", "--report", "r.json", "--baseline",
      "abfss://c@a.dfs.core.windows.net/run"], "--baseline"),
    (["gate", "--report", "r.json", "--champion", "gs://b/reg"], "--champion"),
])
def test_an_option_for_local_paths_refuses_a_url_in_one_line(argv, option, tmp_path, capsys,
                                                             monkeypatch):
    """These wrote to (or read from) a local folder named `s3:`, and said they had used the URL;
    the refusal comes before any work, and nothing is written."""
    from hvd_ctsm import cli
    from hvd_ctsm.errors import run_cli

    monkeypatch.chdir(tmp_path)
    code = run_cli(cli.main, "hvd-ctsm", argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert option in err and "takes a local path" in err and "://" in err, err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("model, out, option", [
    ("s3://b/reg", "scores", "--model"), ("reg", "s3://b/scores", "--out")])
def test_the_spark_scorer_refuses_a_url_model_or_folder_before_spark(model, out, option,
                                                                     tmp_path, capsys,
                                                                     monkeypatch):
    """--out s3://... was built as a local folder named `s3:` (the docs said it was refused);
    a URL --model was found missing after Spark had started."""
    from hvd_ctsm.errors import run_cli
    from spark_jobs import score_topk

    monkeypatch.chdir(tmp_path)
    code = run_cli(score_topk.main, "score_topk", ["--data", "features", "--model", model,
                                                   "--out", out])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert option in err and "takes a local path" in err and "://" in err, err
    assert not list(tmp_path.iterdir())


def test_a_model_option_still_takes_models_uris_and_volume_paths(tmp_path):
    """The up-front check lets through what the options take besides a local path."""
    from hvd_ctsm.evaluation import backtest, champion
    from hvd_ctsm.serving.score import check_model_option
    from spark_jobs.score_topk import check_options

    check_model_option("models:/ctsm@champion")
    champion.check_ref("models:/ctsm@champion")
    check_options("models:/ctsm/3", "table:main.recsys.scores")
    # --champion and --baseline map dbfs:/Volumes/... to the mounted path, as every option
    # naming a model does (they were refused as URLs)
    with pytest.raises(FileNotFoundError, match="/Volumes/main/recsys/nowhere/reg"):
        backtest.main(["--data", str(tmp_path / "features"), "--model", str(tmp_path / "run"),
                       "--report", str(tmp_path / "r.json"), "--champion",
                       "dbfs:/Volumes/main/recsys/nowhere/reg"])
