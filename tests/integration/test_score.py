"""Batch scoring, both routes, on the tiny synthetic dataset with a really trained model."""

import json
import logging
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from hvd_ctsm.data.schema import SERVING_SPLIT
from hvd_ctsm.serving import score
from tests.integration.test_features_e2e import read_split

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.both_stacks]
K = 5


@pytest.fixture(scope="module")
def model_run(tiny_features, tmp_path_factory):
    work = tmp_path_factory.mktemp("score")
    out, data = work / "run", work / "features-without-serving"
    # Training and validation must never read the serving rows: train where they do not exist.
    shutil.copytree(tiny_features, data, ignore=shutil.ignore_patterns(SERVING_SPLIT))
    proc = subprocess.run(
        [sys.executable, "-m", "hvd_ctsm.train", "--data", str(data), "--out", str(out),
         "--epochs", "1", "data.batch_size=16", "model.dim=16", "model.layers=1",
         "progress=false"], capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def clients(tiny_features):
    """{client_id: items it ever had (indices)} from the test split, read independently."""
    rows = read_split(tiny_features / "test", fields=["client_id", "client_items"])
    return {r["client_id"]: set(int(i) for i in r["client_items"]) for r in rows}


def check_scores(table, clients, vocab_items):
    rows = table.to_pylist()
    by_client = {}
    for row in rows:
        by_client.setdefault(row["client_id"], []).append(row)
    assert set(by_client) == set(clients)  # every client scored
    for client, recs in by_client.items():
        assert [r["rank"] for r in recs] == list(range(1, K + 1))  # K items each, ranked
        items = [r["item"] for r in recs]
        assert len(set(items)) == K and 0 not in items
        assert not set(items) & clients[client]  # nothing the client already had
        assert all(vocab_items[r["item"]] == r["item_id"] for r in recs)
        scores = [r["score"] for r in recs]
        assert scores == sorted(scores, reverse=True)
        assert all(0.0 <= r["p_sale"] <= 1.0 for r in recs)
    return {c: [r["item"] for r in recs] for c, recs in by_client.items()}


def test_cli_and_spark_job_score_every_client_alike(spark, tiny_features, model_run, clients,
                                                    tmp_path, capsys):
    from spark_jobs.score_topk import score_topk

    vocab_items = json.loads((tiny_features / "vocab.json").read_text())["items"]
    out = tmp_path / "scores.parquet"
    assert score.main(["--data", str(tiny_features), "--model", str(model_run),
                       "--out", str(out), "--k", str(K), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["split"] == SERVING_SPLIT
    local = check_scores(pq.read_table(out), clients, vocab_items)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left

    summary = score_topk(spark, str(tiny_features), str(model_run), str(tmp_path / "spark"), k=K)
    assert summary["scored_clients"] == summary["clients"] == len(clients)
    assert summary["split"] == SERVING_SPLIT
    assert summary["rows"] == K * len(clients) and summary["short"] == 0
    distributed = check_scores(pq.read_table(tmp_path / "spark"), clients, vocab_items)
    assert distributed == local  # the two routes agree item for item


def test_spark_scores_go_into_a_catalog_table_replaced_only_with_overwrite(
        spark, tiny_features, model_run, clients, tmp_path):
    """--out table:NAME (a database whose warehouse is under tmp_path, as a Unity Catalog
    schema would be on Databricks): the same scores as the Parquet route's."""
    from spark_jobs.score_topk import main, score_topk

    spark.sql(f"CREATE DATABASE ctsm_out LOCATION '{(tmp_path / 'warehouse').as_uri()}'")
    try:
        summary = score_topk(spark, str(tiny_features), str(model_run), "table:ctsm_out.scores",
                             k=K)
        assert summary["table"] == "ctsm_out.scores" and summary["rows"] == K * len(clients)
        table = spark.table("ctsm_out.scores").toPandas().sort_values(["client_id", "rank"])
        vocab_items = json.loads((tiny_features / "vocab.json").read_text())["items"]
        in_table = check_scores(SimpleNamespace(to_pylist=lambda: table.to_dict("records")),
                                clients, vocab_items)
        score_topk(spark, str(tiny_features), str(model_run), str(tmp_path / "parquet"), k=K)
        assert in_table == top_items(tmp_path / "parquet")
        args = ["--data", str(tiny_features), "--model", str(model_run), "--out",
                "table:ctsm_out.scores", "--k", "3"]
        assert main(args) == 2  # an existing table is never replaced without --overwrite
        assert spark.table("ctsm_out.scores").count() == K * len(clients)
        assert main([*args, "--overwrite"]) == 0
        assert spark.table("ctsm_out.scores").count() == 3 * len(clients)
        # The folder of a table an in-memory catalog forgot (a local session's second run):
        # refused in one line, exit 2, even with --overwrite; the folder is not ours to remove
        leftover = tmp_path / "warehouse" / "forgotten"
        leftover.mkdir()
        (leftover / "part-0.parquet").write_bytes(b"a user's")
        args[5] = "table:ctsm_out.forgotten"
        assert main([*args, "--overwrite"]) == 2
        assert (leftover / "part-0.parquet").read_bytes() == b"a user's"
        # A name Spark cannot parse, a schema that does not exist: one line, exit 2 (crashes)
        for name in ("table:no such!", "table:no_such_schema.scores"):
            args[5] = name
            assert main(args) == 2
    finally:
        spark.sql("DROP DATABASE IF EXISTS ctsm_out CASCADE")


def top_items(path) -> dict:
    picks: dict = {}
    for row in pq.read_table(path).to_pylist():
        picks.setdefault(row["client_id"], []).append(row["item"])
    return picks


def test_scores_start_from_each_clients_latest_event(tiny_features, model_run, tmp_path, caplog):
    from hvd_ctsm.model.checkpoint import load_state
    from hvd_ctsm.model.ctsm import CTSM

    serving = {r["client_id"]: r for r in read_split(tiny_features / SERVING_SPLIT)}
    test = {r["client_id"]: r for r in read_split(tiny_features / "test")}
    clients = sorted(serving)
    assert clients == sorted(test)
    for c in clients:  # the held-out last event is the serving history's newest event
        assert serving[c]["item"][-1] == test[c]["target_item"][0]
        assert serving[c]["timestamp"][-1] == test[c]["target_time"][0]
    model = CTSM.from_checkpoint(load_state(score.resolve_model(model_run)))
    states = {name: score.client_states(model, [SimpleNamespace(**rows[c]) for c in clients],
                                        model.sizes.max_len)
              for name, rows in (("serving", serving), ("test", test))}
    for new, old in zip(states["serving"], states["test"], strict=True):
        assert not torch.allclose(new, old)  # the last event moved every client's state

    summary = score.score_dataset(tiny_features, model_run, tmp_path / "serving.parquet", k=K)
    assert summary["split"] == SERVING_SPLIT and summary["scored_clients"] == len(clients)
    picks = top_items(tmp_path / "serving.parquet")
    assert all(serving[c]["item"][-1] not in picks[c] for c in clients)
    score.score_dataset(tiny_features, model_run, tmp_path / "test.parquet", k=K, split="test")
    assert picks != top_items(tmp_path / "test.parquet")

    # Features built before the serving split: the test rows, with a warning saying so.
    old = tmp_path / "features-before-serving"
    shutil.copytree(tiny_features, old, ignore=shutil.ignore_patterns(SERVING_SPLIT))
    meta = json.loads((old / "metadata.json").read_text())
    del meta["splits"][SERVING_SPLIT]
    (old / "metadata.json").write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="hvd_ctsm.serving.score"):
        fallback = score.score_dataset(old, model_run, tmp_path / "old.parquet", k=K)
    assert fallback["split"] == "test" and "rebuild the features" in caplog.text
    # The test rows' states, standing in for serving ones: every item the client had (its
    # held-out target too) is left out, where --split test leaves out only those before it.
    scored = {(r["client_id"], r["item"]): r["score"]
              for r in pq.read_table(tmp_path / "test.parquet").to_pylist()}
    for row in pq.read_table(tmp_path / "old.parquet").to_pylist():
        assert row["item"] not in test[row["client_id"]]["client_items"]
        if (row["client_id"], row["item"]) in scored:
            assert row["score"] == scored[row["client_id"], row["item"]]


def test_test_split_ranks_each_target_as_the_backtest_does(spark, tiny_features, model_run,
                                                          tmp_path):
    """--split test leaves out only the items a client had before its target (prior_items), as
    the backtest's full ranking does: a target the client never had before is recommended at its
    backtest rank, by both scorers. Before, every item ever had (the target too) was left out."""
    from hvd_ctsm.data.dataset import Dataset
    from hvd_ctsm.evaluation.backtest import evaluate_model
    from hvd_ctsm.model.checkpoint import load_model
    from spark_jobs.score_topk import score_topk

    dataset = Dataset.open(tiny_features)
    num_items = dataset.meta.num_items
    model, _ = load_model(score.resolve_model(model_run))
    result = evaluate_model(dataset, model, "test", 0, "model")
    backtest_rank = {client: int(rank) for (client, _), rank in
                     zip(result.targets, np.concatenate(result.ranks["full"]), strict=True)}
    test = {r["client_id"]: r for r in read_split(tiny_features / "test")}
    new = [c for c, r in test.items() if r["target_item"][0] not in set(r["prior_items"])]
    assert new  # targets the client never had before: the ones the two masks disagree on

    k = num_items - 1  # every item but padding: each client's whole ranking
    score.score_dataset(tiny_features, model_run, tmp_path / "test.parquet", k=k, split="test")
    score_topk(spark, str(tiny_features), str(model_run), str(tmp_path / "spark"), k=k,
               split="test")
    for scores in (tmp_path / "test.parquet", tmp_path / "spark"):
        ranked: dict = {}
        for row in sorted(pq.read_table(scores).to_pylist(), key=lambda r: r["rank"]):
            ranked.setdefault(row["client_id"], []).append(row["item"])
        for client, row in test.items():
            allowed = set(range(1, num_items)) - set(int(i) for i in row["prior_items"])
            assert set(ranked[client]) == allowed
        for client in new:
            target = int(test[client]["target_item"][0])
            assert ranked[client].index(target) == backtest_rank[client]


def test_scoring_refuses_a_model_of_another_vocabulary(tiny_features, model_run, tmp_path):
    data = tmp_path / "other"
    shutil.copytree(tiny_features, data)
    meta = json.loads((data / "metadata.json").read_text())
    meta["vocab_sha256"] = "0" * 64
    (data / "metadata.json").write_text(json.dumps(meta))
    out = tmp_path / "scores.parquet"
    # bad input (exit 2, hvd_ctsm.errors): one line, nothing written
    assert score.main(["--data", str(data), "--model", str(model_run), "--out", str(out)]) == 2
    assert not out.exists()
