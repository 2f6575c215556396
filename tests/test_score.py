"""Batch scoring, both routes, on the tiny synthetic dataset with a really trained model."""

import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from hvd_ctsm import score
from tests.test_features_e2e import read_split

pytestmark = [pytest.mark.spark, pytest.mark.slow]
K = 5


@pytest.fixture(scope="module")
def model_run(tiny_features, tmp_path_factory):
    out = tmp_path_factory.mktemp("score") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "hvd_ctsm.train", "--data", str(tiny_features), "--out", str(out),
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
                                                    tmp_path):
    import json

    from spark_jobs.score_topk import score_topk

    vocab_items = json.loads((tiny_features / "vocab.json").read_text())["items"]
    out = tmp_path / "scores.parquet"
    assert score.main(["--data", str(tiny_features), "--model", str(model_run),
                       "--out", str(out), "--k", str(K)]) == 0
    local = check_scores(pq.read_table(out), clients, vocab_items)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left

    summary = score_topk(spark, str(tiny_features), str(model_run), str(tmp_path / "spark"), k=K)
    assert summary["scored_clients"] == summary["clients"] == len(clients)
    assert summary["rows"] == K * len(clients) and summary["short"] == 0
    distributed = check_scores(pq.read_table(tmp_path / "spark"), clients, vocab_items)
    assert distributed == local  # the two routes agree item for item


def test_scoring_refuses_a_model_of_another_vocabulary(tiny_features, model_run, tmp_path):
    import json
    import shutil

    data = tmp_path / "other"
    shutil.copytree(tiny_features, data)
    meta = json.loads((data / "metadata.json").read_text())
    meta["vocab_sha256"] = "0" * 64
    (data / "metadata.json").write_text(json.dumps(meta))
    out = tmp_path / "scores.parquet"
    assert score.main(["--data", str(data), "--model", str(model_run), "--out", str(out)]) == 1
    assert not out.exists()
