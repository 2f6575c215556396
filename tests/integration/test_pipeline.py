"""The one-application pipeline through the real `spark-submit`, on small synthetic data."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_ctsm.files import outputs
from hvd_ctsm.serving import deploy
from tests.conftest import REPO, TINY_SOURCE

pytestmark = [pytest.mark.spark, pytest.mark.horovod, pytest.mark.slow, pytest.mark.e2e]
BIN = Path(sys.executable).parent
TRAIN = ["epochs=1", "data.batch_size=16", "model.dim=16", "model.layers=1", "progress=false",
         "dist.threads_per_rank=1"]


def submit(work, registry, gate, *extra):
    """spark-submit with the venv's bin first on PATH, so that executors run its python."""
    cmd = [str(BIN / "spark-submit"), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
           str(REPO / "spark_jobs" / "pipeline.py"), "--source", TINY_SOURCE, "--work", str(work),
           "--registry", str(registry), "--gate", gate, "--num-proc", "2", "--max-len", "40",
           "--row-groups", "8", *extra, *TRAIN]
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
           "PYSPARK_PYTHON": sys.executable}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)


def test_pipeline_deploys_then_a_refusing_gate_deploys_nothing(tmp_path):
    registry, work = tmp_path / "registry", tmp_path / "work"
    # --warm-start with nothing deployed yet says so and trains from scratch
    first = submit(work, registry, "sampled.hr@10>=0.05", "--warm-start")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert f"--warm-start: {registry} has no deployed model yet: training from scratch" in \
        first.stdout, first.stdout[-3000:]
    assert "warm start from" not in first.stdout + first.stderr
    assert outputs.marker(work)["kind"] == "pipeline"  # the second run may reuse it
    version = deploy.current(registry)
    assert version is not None and version.name == "v0001"
    assert (version / "model.pt").exists() and (version / "vocab.json").exists()
    record = json.loads((work / "pipeline.json").read_text())
    assert [s["step"] for s in record["steps"]] == ["features", "train", "backtest", "deploy"]
    assert all(s["outcome"] == "ok" for s in record["steps"])

    # The retrain, in the same work folder, extends the deployed vocabulary, warm-starts from
    # the deployed model, splits by time, and an impossible gate stops it: non-zero exit, the
    # registry unchanged.
    second = submit(work, registry, "ndcg@10>=1.01", "--warm-start",
                    "--split", "time", "--cutoffs", "2021-07-01,2021-10-01")
    assert second.returncode == 1, second.stdout[-3000:] + second.stderr[-3000:]
    assert deploy.current(registry) == version and len(list(registry.glob("v*"))) == 1
    meta = json.loads((work / "features" / "metadata.json").read_text())
    assert meta["previous_vocab"] == str(version / "vocab.json")
    assert meta["split"] == {"kind": "time", "cutoffs": [1625097600, 1633046400]}
    old_items = json.loads((version / "vocab.json").read_text())["items"]
    new_items = json.loads((work / "features" / "vocab.json").read_text())["items"]
    assert new_items[:len(old_items)] == old_items
    assert "warm start from" in second.stdout + second.stderr
    report = json.loads((work / "backtest.json").read_text())
    assert report["gate"]["passed"] is False


def test_a_failing_step_exits_non_zero_and_names_it(tmp_path):
    from spark_jobs.pipeline import main

    code = main(["--source", "events:" + str(tmp_path / "missing.parquet"), "--work",
                 str(tmp_path / "run"), "--registry", str(tmp_path / "registry"),
                 "--master", "local[2]"])
    assert code == 2  # a missing input: bad input, as every program says it
    record = json.loads((tmp_path / "run" / "pipeline.json").read_text())
    assert record["steps"][0]["step"] == "features" and record["steps"][0]["outcome"] == "failed"
    assert not (tmp_path / "registry").exists()
