"""MLflow tracking, registry and pyfunc flavour on real local MLflow stores (SQLite in tmp_path).

The end-to-end test runs `./run.sh demo` itself (features, 2 ranks under torchrun, backtest, gate,
deploy, score) into tmp_path and reads what it left through MLflow's own client; the pyfunc
model is then loaded from the registry and scored with pandas and with Spark. What spark_udf
does with null and integer input is tried on a small untrained model (tests/helpers), in seconds.
The unit-tier part is in tests/unit/test_tracking.py."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_ctsm.tracking.link import read_link
from tests.conftest import REPO, RUN_SH_ENV
from tests.helpers.small_pyfunc import registered_model

pytestmark = pytest.mark.both_stacks

DEMO_DATA = "synthetic:clients=160,items=60,events=6000,seed=11"
# A Unity Catalog-style three-level name (catalog.schema.model), as Databricks users register.
NAME = "main.recsys.ctsm"
DEMO_TRAIN = ["data.batch_size=16", "model.dim=32", "model.layers=1", "progress=false",
              f"tracking.registered_model={NAME}"]
# A trainer's rank 0 in miniature: the real writer on a real store, a `with` block that raises,
# then a crash (run_cli turns it into exit code 3, as hvd_ctsm.train's command does) or a Ctrl-C.
STOPPED_TRAINER = """
import sys
from pathlib import Path
from hvd_ctsm import tracking
from hvd_ctsm.config import load_config
from hvd_ctsm.errors import run_cli

class Board:
    def add_scalar(self, *args):
        pass

    def close(self):
        pass

def writer(name):
    out = Path(sys.argv[1]) / name
    out.mkdir()
    cfg = load_config(None, [f"out={out}", f"data.path={sys.argv[1]}"])
    return tracking.metrics_writer(Board(), cfg, {}, "horovod", 1, False)

def main(argv):
    try:
        with writer(f"with-{argv[0]}") as board:
            board.add_scalar("loss/next_item", 1.0, 1)
            raise ValueError("a bug in the training loop")
    except ValueError:
        pass
    board = writer(argv[0])
    board.add_scalar("loss/next_item", 0.5, 7)
    raise (KeyboardInterrupt if argv[0] == "interrupted" else RuntimeError)("stopped")

sys.exit(run_cli(main, "hvd_ctsm.train", sys.argv[2:]))
"""


@pytest.mark.slow  # two Python processes that import mlflow (tens of seconds)
def test_a_stopped_training_ends_its_run_failed_or_killed(tmp_path, monkeypatch):
    """A run the trainer never closed ends FAILED after a crash and KILLED after Ctrl-C (the
    exit hook), with its last buffered metrics; a `with` block that raises ends FAILED."""
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    codes = {}
    for how in ("crashed", "interrupted"):
        proc = subprocess.run([sys.executable, "-c", STOPPED_TRAINER, str(tmp_path), how],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        codes[how] = proc.returncode
        assert "Traceback" not in proc.stderr or how == "interrupted", proc.stderr[-2000:]
    assert codes["crashed"] == 3 and codes["interrupted"] != 0
    client = MlflowClient(store_uri(tmp_path))
    status = {name: client.get_run(read_link(tmp_path / name).run_id).info.status
              for name in ("crashed", "interrupted", "with-crashed", "with-interrupted")}
    assert status == {"crashed": "FAILED", "interrupted": "KILLED", "with-crashed": "FAILED",
                      "with-interrupted": "FAILED"}
    history = client.get_metric_history(read_link(tmp_path / "crashed").run_id,
                                        "loss/next_item")
    assert [(m.step, m.value) for m in history] == [(7, 0.5)]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """`./run.sh demo` on a small synthetic set, 2 epochs, into a fresh WORK folder. 8 row groups
    per split: the default 64 for 160 clients wrote 256 files of 2-3 rows each, most of the
    fixture's time."""
    work = tmp_path_factory.mktemp("demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env |= {"WORK": str(work), "DATA": DEMO_DATA, "EPOCHS": "2", "NP": "2", "ROW_GROUPS": "8",
            "GATE": "ndcg@10>=0.02", "OMP_NUM_THREADS": "1", **RUN_SH_ENV}
    proc = subprocess.run(["bash", str(REPO / "run.sh"), "demo", *DEMO_TRAIN], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    for warning in ("type hints to the `predict`", "serialized using CloudPickle",
                    "input example was not provided"):  # deploy removed their causes
        assert warning not in proc.stdout + proc.stderr, warning
    # Petastorm's deprecation warnings (in the driver and every Spark Python worker) and
    # torchrun's banner about OMP_NUM_THREADS are silenced: the demo's output is its steps.
    for noise in ("FutureWarning", "Setting OMP_NUM_THREADS"):
        assert noise not in proc.stdout + proc.stderr, noise
    return work


def store_uri(work: Path) -> str:
    return f"sqlite:///{work / 'mlflow' / 'mlflow.db'}"


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("launch_flags",
                         [[], pytest.param(["--elastic"], marks=pytest.mark.horovod)])
def test_a_training_that_fails_in_a_notebook_ends_its_run_at_once(demo, tmp_path, monkeypatch,
                                                                  caplog, launch_flags):
    """The trainer called in-process, as a notebook does, on a dataset damaged in its pages:
    its MLflow run stayed RUNNING after the call raised, until the process ended (the exit
    hook ended it then), and a command's last line was that hook's, after the error's. Now the
    run is FAILED when the call raises, said before the error; an elastic run's too (its own
    loop left it to the exit hook)."""
    import shutil

    from mlflow import MlflowClient

    from hvd_ctsm.data.batches import DatasetError
    from hvd_ctsm.train import launch
    from tests.helpers import faultlib as fl

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    caplog.set_level(logging.INFO, logger="hvd_ctsm.tracking")
    data, run = tmp_path / "features", tmp_path / "model"
    shutil.copytree(demo / "features", data)
    fl.damage_pages(data / "train" / "part-00000.parquet")
    with pytest.raises(DatasetError, match="the file is damaged"):
        launch.main(["--data", str(data), "--out", str(run), *launch_flags, "epochs=1",
                     *DEMO_TRAIN])
    link = read_link(run)
    assert MlflowClient(store_uri(tmp_path)).get_run(link.run_id).info.status == "FAILED"
    assert f"MLflow: run {link.run_id} ended FAILED" in caplog.text


@pytest.mark.spark
@pytest.mark.slow
def test_demo_ends_with_a_tracked_run_and_a_champion(demo):
    from mlflow import MlflowClient

    client = MlflowClient(store_uri(demo))
    champion = client.get_model_version_by_alias(NAME, "champion")
    assert str(champion.version) == "1" and champion.tags["folder_version"] == "v0001"
    run = client.get_run(champion.run_id)
    assert run.info.run_id == read_link(demo / "model").run_id
    assert run.info.status == "FINISHED"
    # run.sh trains under torchrun on a host without GPUs (as CI's), horovodrun where it has them
    assert run.data.tags["backend"] == "torch" and run.data.tags["ranks"] == "2"
    assert run.data.tags["gate.passed"] == "True"
    assert run.data.params["epochs"] == "2" and run.data.params["model.dim"] == "32"
    for key in ("loss/next_item", "lr", "samples_per_s", "time_share/allreduce",
                "val_full/ndcg_at_10", "backtest/model/full/ndcg_at_10"):
        assert key in run.data.metrics, key
    report = json.loads((demo / "model" / "backtest.json").read_text())
    assert run.data.metrics["backtest/model/full/ndcg_at_10"] == pytest.approx(
        report["model"]["full"]["ndcg@10"])
    assert {"config.yaml", "metadata.json", "train_summary.json", "backtest.json"} <= {
        a.path for a in client.list_artifacts(run.info.run_id)}


@pytest.mark.spark
@pytest.mark.slow
def test_champion_moves_only_after_a_passed_gate(demo, capsys, monkeypatch):
    """The gate reads the champion from the registry; a passing deploy moves the alias to the
    new version, a refused one registers nothing and leaves it. Neither leaves the registry's
    store in MLFLOW_TRACKING_URI, where every process started later would log."""
    from mlflow import MlflowClient

    from hvd_ctsm.evaluation import gate
    from hvd_ctsm.serving import deploy
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    model, report = demo / "model", demo / "model" / "backtest.json"
    champion = ["--champion", f"models:/{NAME}@champion", "--tolerance", "0"]
    assert gate.main(["--report", str(report), "--gate", "ndcg@10>=0.02", *champion]) == 0
    checks = json.loads(report.read_text())["gate"]["checks"]
    assert checks[-1]["rule"].startswith("full.ndcg@10 >= champion")  # read from the registry
    assert checks[-1]["champion"]["same_data"] is True  # its report: the same features
    assert deploy.main(["--model", str(model), "--report", str(report),
                        "--registry", str(demo / "registry")]) == 0
    client = MlflowClient(store_uri(demo))
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "2"
    assert gate.main(["--report", str(report), "--gate", "ndcg@10>=1.01", *champion]) == 1
    assert deploy.main(["--model", str(model), "--report", str(report),
                        "--registry", str(demo / "registry")]) == 1
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "2"
    assert len(client.search_model_versions(f"name='{NAME}'")) == 2
    assert "MLFLOW_TRACKING_URI" not in os.environ


def serving_histories(features: Path):
    """The serving rows of clients whose whole history fits the window and whose attributes
    never change, as the pyfunc input (raw ids and names): exactly what batch scoring saw."""
    import pandas as pd

    from hvd_ctsm.data.batches import open_reader, split_url
    from hvd_ctsm.data.schema import EVENT_TYPES

    vocab = json.loads((features / "vocab.json").read_text())
    meta = json.loads((features / "metadata.json").read_text())
    with open_reader(split_url(features, "serving"), 0, 1, seed=None, shuffle=False) as reader:
        rows = [r for r in reader if r.history_len < meta["max_len"]
                and (r.client_attrs == r.client_attrs[-1]).all()]
    assert len(rows) >= 20
    return pd.DataFrame({
        "client_id": [str(r.client_id) for r in rows],
        "items": [[vocab["items"][i] for i in r.item] for r in rows],
        "event_types": [[EVENT_TYPES[t - 1] for t in r.event_type] for r in rows],
        "values": [[float(v) for v in r.value] for r in rows],
        "timestamps": [[int(t) for t in r.timestamp] for r in rows],
        **{name: [vocab["attrs"][name][r.client_attrs[-1][i]] for r in rows]
           for i, name in enumerate(meta["attrs"])}})


@pytest.mark.spark
@pytest.mark.slow
def test_pyfunc_from_the_registry_scores_pandas_and_spark(demo, spark, monkeypatch):
    """models:/ctsm@champion gives the same top-10 as batch scoring (hvd_ctsm.serving.score) for the
    same histories, with pandas and through spark_udf."""
    import mlflow
    import pandas as pd
    from pyspark.sql.functions import struct

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store_uri(demo))  # this test's processes only
    histories = serving_histories(demo / "features")
    model = mlflow.pyfunc.load_model(f"models:/{NAME}@champion")
    top = model.predict(histories, params={"k": 10})
    assert list(top["client_id"]) == list(histories["client_id"])
    batch = pd.read_parquet(demo / "scores.parquet").sort_values(["client_id", "rank"])
    expected = batch.groupby("client_id")["item_id"].apply(list)
    expected_scores = batch.groupby("client_id")["score"].apply(list)
    for client, items, scores, history in zip(top["client_id"], top["item_ids"], top["scores"],
                                              histories["items"], strict=True):
        assert len(items) == 10 and not set(items) & set(history)
        assert scores == pytest.approx(expected_scores[client], abs=1e-4)
        assert items == expected[client]
    three = model.predict(histories.head(2), params={"k": 3})
    assert [len(items) for items in three["item_ids"]] == [3, 3]

    udf = mlflow.pyfunc.spark_udf(spark, f"models:/{NAME}@champion", env_manager="local",
                                  result_type="item_ids array<string>, scores array<double>")
    frame = spark.createDataFrame(histories.head(8))
    columns = list(histories.columns)
    scored = frame.withColumn("top", udf(struct(*columns))).select("client_id", "top.item_ids")
    by_spark = {row.client_id: list(row.item_ids) for row in scored.collect()}
    assert by_spark == {c: expected[c] for c in histories["client_id"].head(8)}


@pytest.mark.spark
@pytest.mark.slow
def test_spark_udf_scores_null_histories_and_integer_ids(spark, tmp_path):
    """A null `items` failed the whole Spark job, and so did array<int> items and a bigint
    client_id (MLflow's signature check). A null history gets empty item_ids and scores, as a
    row without a known item does; integer ids are read as their text, a null one skipped."""
    import mlflow
    from pyspark.sql.functions import struct

    udf = mlflow.pyfunc.spark_udf(spark, registered_model(tmp_path), env_manager="local",
                                  result_type="item_ids array<string>, scores array<double>",
                                  params={"k": 3})

    def top(rows: list, schema: str) -> dict:
        frame = spark.createDataFrame(rows, schema)
        scored = frame.withColumn("top", udf(struct("client_id", "items"))).collect()
        return {row.client_id: (list(row.top.item_ids), len(row.top.scores)) for row in scored}

    by_text = top([("7", ["10", "11"]), ("8", ["12"]), ("9", None)],
                  "client_id string, items array<string>")
    assert [(len(ids), count) for ids, count in by_text.values()] == [(3, 3), (3, 3), (0, 0)]
    by_ints = top([(7, [10, None, 11]), (None, [12])], "client_id bigint, items array<int>")
    assert by_ints == {7: by_text["7"], None: by_text["8"]}


def counts_line(capsys) -> dict:
    """The summary a scoring command printed (--json), without what differs from run to run."""
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return {key: value for key, value in summary.items() if key not in ("seconds", "out")}


@pytest.mark.spark
@pytest.mark.slow
def test_scoring_jobs_score_the_registered_champion(demo, spark, tmp_path, monkeypatch, capsys):
    """hvd_ctsm.serving.score and the Spark job score with models:/ctsm@champion (from the store
    beside
    the features, or the one --tracking-uri names) exactly as with the folder registry: the
    same rows, the same counts line."""
    import pandas as pd

    from hvd_ctsm.serving import score
    from spark_jobs import score_topk

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    features, registry = str(demo / "features"), str(demo / "registry")
    by_folder, by_uri = tmp_path / "folder.parquet", tmp_path / "uri.parquet"
    assert score.main(["--data", features, "--model", registry, "--out", str(by_folder),
                       "--json"]) == 0
    expected = counts_line(capsys)
    assert score.main(["--data", features, "--model", f"models:/{NAME}@champion",
                       "--out", str(by_uri), "--json"]) == 0  # the default store: DATA/../mlflow
    assert counts_line(capsys) == expected
    pd.testing.assert_frame_equal(pd.read_parquet(by_uri), pd.read_parquet(by_folder))

    spark_out = tmp_path / "spark"
    assert score_topk.main(["--data", features, "--model", f"models:/{NAME}@champion",
                            "--tracking-uri", store_uri(demo), "--out", str(spark_out),
                            "--json"]) == 0
    assert counts_line(capsys) == expected
    order = ["client_id", "rank"]
    pd.testing.assert_frame_equal(
        pd.read_parquet(spark_out).sort_values(order).reset_index(drop=True),
        pd.read_parquet(by_folder).sort_values(order).reset_index(drop=True))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


@pytest.mark.spark
@pytest.mark.slow
def test_a_models_uri_that_names_nothing_is_one_line_and_exit_2(demo, spark, tmp_path,
                                                                 monkeypatch, capsys):
    from hvd_ctsm.serving import score
    from spark_jobs import score_topk

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    missing_store = tmp_path / "none" / "mlflow.db"
    cases = {f"models:/{NAME}@nosuch": f"no version of '{NAME}' has the alias 'nosuch'",
             "models:/nosuch@champion": "no registered model 'nosuch'",
             f"models:/{NAME}/99": f"'{NAME}' has no version 99",
             f"models:/{NAME}": "use models:/NAME@ALIAS",
             f"sqlite:///{missing_store}": f"no MLflow store at {missing_store}",
             "nosuch://store": f"cannot read models:/{NAME}@champion from the MLflow store"}
    for ref, problem in cases.items():
        model, uri = ref, store_uri(demo)
        if not ref.startswith("models:/"):  # a store that is not there
            model, uri = f"models:/{NAME}@champion", ref
        for job in (score, score_topk):
            out = tmp_path / f"{job.__name__}.parquet"
            code = job.main(["--data", str(demo / "features"), "--model", model,
                             "--tracking-uri", uri, "--out", str(out)])
            err = capsys.readouterr().err.strip().splitlines()
            assert code == 2 and len(err) == 1 and problem in err[0], (ref, job, err)
            assert "--tracking-uri" in err[0] or "models:/" in err[0]  # it names the fix
            assert not out.exists()
    assert not missing_store.parent.exists()  # no empty store was created


@pytest.mark.spark
@pytest.mark.slow
def test_a_registered_champion_from_other_data_is_evaluated_on_these_targets(demo, tmp_path,
                                                                             capsys, monkeypatch):
    """backtest --champion models:/NAME@champion on other features than the champion's report
    was measured on: the registered version's model.pt, downloaded, is evaluated on these
    targets (the champion is the demo's model: it scores what the model does)."""
    from hvd_ctsm.evaluation import backtest
    from tests.helpers.other_targets import other_targets
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    other, report = other_targets(demo / "features", tmp_path / "newer"), tmp_path / "new.json"
    capsys.readouterr()
    assert backtest.main(["--data", str(other), "--model", str(demo / "model"), "--report",
                          str(report), "--champion", f"models:/{NAME}@champion",
                          "--tolerance", "0"]) == 0
    assert f"champion: its report (models:/{NAME}@champion: " in capsys.readouterr().out
    result = json.loads(report.read_text())
    assert result["champion"]["full"] == result["model"]["full"]
    assert result["gate"]["checks"][-1]["champion"]["same_data"] is False
