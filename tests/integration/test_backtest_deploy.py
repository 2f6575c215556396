"""Backtest report, gate exit codes and the deploy that only follows a passed gate.
The unit-tier part is in tests/unit/test_backtest_deploy.py."""

import json
import os
import subprocess
import sys

import pytest

from hvd_ctsm.evaluation import backtest
from hvd_ctsm.serving import deploy


@pytest.fixture(scope="module")
def trained(tiny_features, tmp_path_factory):
    out = tmp_path_factory.mktemp("bt") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "hvd_ctsm.train", "--data", str(tiny_features), "--out", str(out),
         "--epochs", "3", "data.batch_size=16", "model.dim=32", "model.layers=1",
         "progress=false"], capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.spark
@pytest.mark.horovod
@pytest.mark.slow
def test_backtest_gate_and_deploy(tiny_features, trained, tmp_path, capsys):
    report, registry = tmp_path / "report.json", tmp_path / "registry"
    code = backtest.main(["--data", str(tiny_features), "--model", str(trained),
                          "--report", str(report), "--gate", "ndcg@10>=1.01"])
    assert code == 1  # impossible gate: the DAG stops
    result = json.loads(report.read_text())
    assert result["gate"]["passed"] is False
    for name in ("model", "popularity"):
        assert result[name]["full"]["targets"] == result[name]["sampled"]["targets"] > 0
        assert 0 <= result[name]["full"]["ndcg@10"] <= 1
    assert deploy.main(["--model", str(trained), "--report", str(report),
                        "--registry", str(registry)]) == 1
    assert deploy.current(registry) is None and not list(registry.glob("v*"))

    code = backtest.main(["--data", str(tiny_features), "--model", str(trained),
                          "--report", str(report), "--gate", "ndcg@10>=0"])
    assert code == 0
    assert deploy.main(["--model", str(trained), "--report", str(report),
                        "--registry", str(registry)]) == 0
    version = deploy.current(registry)
    assert version.name == "v0001"
    assert {"model.pt", "config.yaml", "metadata.json", "vocab.json",
            "backtest.json"} <= {p.name for p in version.iterdir()}
    # A champion gate against the registry's deployed report: the same model is not worse
    # than itself.
    assert backtest.main(["--data", str(tiny_features), "--model", str(trained), "--report",
                          str(tmp_path / "r2.json"), "--champion", str(registry),
                          "--tolerance", "0"]) == 0


@pytest.mark.spark
@pytest.mark.slow
def test_a_warm_start_from_another_architecture_stops_in_one_line(tiny_features, trained,
                                                                   tmp_path):
    """`trained` has 1 layer; a retrain with the default 3 must not load it half (the old
    default was 2 x 2 blocks, so a registry from before 2026-11-25 meets this)."""
    out = tmp_path / "retrain"
    proc = subprocess.run(
        [sys.executable, "-m", "hvd_ctsm.train", "--data", str(tiny_features), "--out", str(out),
         "--init-from", str(trained / "model.pt"), "--epochs", "1", "data.batch_size=16",
         "model.dim=32", "progress=false", "tracking.enabled=false"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "model.layers=1" in errors[0] and "model.layers=3" in errors[0]
    assert not out.exists()  # nothing trained, nothing written
