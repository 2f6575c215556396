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


@pytest.mark.spark
@pytest.mark.slow
def test_a_warm_start_onto_a_vocabulary_that_does_not_keep_its_indices_is_refused(
        spark, tiny_features, trained, tmp_path):
    """Features of newer events built without --previous-vocab index items anew: --init-from
    copied the old rows onto other items and trained on, exit 0. Now one line naming the fix;
    the same events with --previous-vocab are taken."""
    from hvd_ctsm.config import load_config
    from hvd_ctsm.train.run_folder import check_warm_start_matches
    from spark_jobs.build_features import build_features
    from spark_jobs.config import FeatureConfig

    newer = "synthetic:clients=200,items=70,events=7000,seed=12"
    fresh, extended = tmp_path / "fresh", tmp_path / "extended"
    build_features(spark, FeatureConfig(source=newer, out=str(fresh), max_len=40, row_groups=4))
    build_features(spark, FeatureConfig(source=newer, out=str(extended), max_len=40, row_groups=4,
                                        previous_vocab=str(tiny_features / "vocab.json")))
    arch = ["model.dim=32", "model.layers=1"]
    with pytest.raises(SystemExit, match="does not keep the indices .* rebuild the features "
                                         f"with --previous-vocab {tiny_features / 'vocab.json'}"):
        check_warm_start_matches(str(trained / "model.pt"),
                                 load_config(None, [f"data.path={fresh}", *arch]))
    check_warm_start_matches(str(trained),  # a run folder, as a registry, names its model.pt
                             load_config(None, [f"data.path={extended}", *arch]))
