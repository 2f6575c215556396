"""Backtest report, gate exit codes and the deploy that only follows a passed gate.
The unit-tier part is in tests/unit/test_backtest_deploy.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_ctsm.evaluation import backtest, gate
from hvd_ctsm.serving import deploy
from tests.helpers.other_targets import other_targets


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
    # than itself. The same data, named by a relative path: its stored score, no evaluation.
    capsys.readouterr()
    assert backtest.main(["--data", os.path.relpath(tiny_features), "--model", str(trained),
                          "--report", str(tmp_path / "r2.json"), "--champion", str(registry),
                          "--tolerance", "0"]) == 0
    again = json.loads((tmp_path / "r2.json").read_text())
    assert "champion" not in again and "champion:" not in capsys.readouterr().out
    assert again["gate"]["checks"][-1]["champion"]["same_data"] is True


@pytest.mark.spark
@pytest.mark.slow
def test_a_champion_from_other_data_is_evaluated_on_these_targets(tiny_features, trained,
                                                                  tmp_path, capsys, monkeypatch):
    """backtest --champion compared the model's score on the new features' targets with the
    champion's stored one from its own (older) features' targets. Now its model.pt is
    evaluated on these targets: deployed from the same model, it scores what the model does.
    It is loaded once (its version's metadata.json says which vocabulary it indexes by)."""
    from hvd_ctsm.model import checkpoint

    report, registry = tmp_path / "report.json", tmp_path / "registry"
    assert backtest.main(["--data", str(tiny_features), "--model", str(trained),
                          "--report", str(report), "--gate", "ndcg@10>=0"]) == 0
    assert deploy.main(["--model", str(trained), "--report", str(report),
                        "--registry", str(registry)]) == 0
    stored = json.loads(report.read_text())["model"]["full"]["ndcg@10"]
    other, new_report = other_targets(tiny_features, tmp_path / "newer"), tmp_path / "new.json"
    capsys.readouterr()
    loaded, load_state = [], checkpoint.load_state
    monkeypatch.setattr(checkpoint, "load_state",
                        lambda path: loaded.append(Path(path)) or load_state(path))
    assert backtest.main(["--data", str(other), "--model", str(trained), "--report",
                          str(new_report), "--champion", str(registry), "--tolerance", "0"]) == 0
    assert loaded.count(registry / "v0001" / "model.pt") == 1
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if line.startswith("champion:")]
    assert len(said) == 1 and "model - champion" in out
    assert said[0].startswith(f"champion: its report ({registry}: full.ndcg@10 {stored:.5f}) "
                              "was measured on other data")
    result = json.loads(new_report.read_text())
    assert result["champion"]["full"] == result["model"]["full"]  # the same model and targets
    assert result["champion_path"] == str(registry / "v0001" / "model.pt")
    check = result["gate"]["checks"][-1]
    assert check["champion"]["same_data"] is False and check["champion"]["stored_ndcg@10"] == stored
    ours = result["model"]["full"]["ndcg@10"]
    assert check["rule"] == f"full.ndcg@10 >= champion {ours:.5f} - 0.0" and check["passed"]
    # The gate step reuses that evaluation; a report of that data without one is refused.
    assert gate.main(["--report", str(new_report), "--champion", str(registry),
                      "--tolerance", "0"]) == 0
    for key in ("champion", "champion_path", "champion_sha256"):
        result.pop(key)
    new_report.write_text(json.dumps(result))
    assert gate.main(["--report", str(new_report), "--champion", str(registry)]) == 2


@pytest.mark.spark
@pytest.mark.slow
def test_a_champion_with_another_vocabulary_keeps_its_stored_score_and_says_so(
        tiny_features, trained, tmp_path, capsys):
    """A champion from other data whose model indexes items otherwise (the usual retrain: new
    items since, features built with --previous-vocab) cannot be ranked on these targets: the
    rule keeps its stored score, and one line says that it is from other targets."""
    from hvd_ctsm.model.checkpoint import load_state, save_state

    version = tmp_path / "registry" / "v0007"
    version.mkdir(parents=True)
    state = load_state(trained / "model.pt")
    state["vocab_sha256"] = "0" * 64  # trained on features with fewer items
    report = {"model": {"full": {"ndcg@10": 0.5}}, "data": "old-features", "split": "test",
              "data_sha256": "1" * 64, "model_sha256": save_state(version / "model.pt", state)}
    (version / "backtest.json").write_text(json.dumps(report))
    assert backtest.main(["--data", str(tiny_features), "--model", str(trained), "--report",
                          str(tmp_path / "r.json"), "--champion", str(version)]) == 1
    out = capsys.readouterr().out
    assert "indexes items otherwise than these features" in out
    assert "the rule uses its stored full.ndcg@10 0.50000, from those targets" in out
    written = json.loads((tmp_path / "r.json").read_text())
    assert "champion" not in written  # not evaluated here
    check = [c for c in written["gate"]["checks"] if "champion" in c["rule"]][0]
    assert check["champion"]["used"].startswith("its report's score (other targets")
    # the gate step on that report decides as the backtest did (not a refusal)
    assert gate.main(["--report", str(tmp_path / "r.json"), "--champion", str(version)]) == 1
    assert "the rule uses its stored full.ndcg@10 0.50000" in capsys.readouterr().out


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
def test_overwrite_never_removes_the_model_a_run_warm_starts_from(tiny_features, trained,
                                                                  tmp_path):
    """`train --out RUN --overwrite --init-from RUN` (or RUN/model.pt) removed RUN, then said
    'RUN/model.pt not found', exit 2: the trained run was gone. It is now refused first, as
    an --out holding the dataset is, and --check says so too (./run.sh train's pre-check)."""
    import shutil

    from hvd_ctsm.train import launch

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    small = ["data.batch_size=16", "model.dim=32", "model.layers=1", "progress=false",
             "tracking.enabled=false"]
    for init in (run, run / "model.pt"):
        for check in ([], ["--check"]):
            with pytest.raises(SystemExit, match="lies inside the input|holds or lies"):
                launch.main(["--data", str(tiny_features), "--out", str(run), "--overwrite",
                             "--init-from", str(init), *check, *small])
            assert (run / "model.pt").read_bytes() == (trained / "model.pt").read_bytes()


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


@pytest.mark.spark
@pytest.mark.slow
def test_a_deploy_during_a_backtest_of_the_registry_leaves_its_report_true(
        tiny_features, trained, tmp_path, monkeypatch):
    """`backtest --model REGISTRY` read `current` again to name and hash the model after
    evaluating it: a deploy meanwhile (a scheduled one) made the report name the new version,
    with the old one's numbers, and deploy then takes a report by that hash. The deploy is
    injected right after the evaluation (the window it opened)."""
    import shutil

    registry = tmp_path / "registry"
    for version, model in (("v0001", trained / "model.pt"), ("v0002", None)):
        (registry / version).mkdir(parents=True)
        if model:
            shutil.copy(model, registry / version / "model.pt")
            shutil.copy(f"{model}.sha256", registry / version / "model.pt.sha256")
        else:  # another model: only its checksum file is read for the report
            (registry / version / "model.pt").write_bytes(b"another model")
            (registry / version / "model.pt.sha256").write_text("0" * 64 + "\n")
    (registry / "current").write_text("v0001\n")
    evaluate = backtest.evaluate_model

    def then_a_deploy(*args, **kwargs):
        result = evaluate(*args, **kwargs)
        (registry / "current").write_text("v0002\n")
        return result

    monkeypatch.setattr(backtest, "evaluate_model", then_a_deploy)
    report = backtest.run_backtest(str(tiny_features), str(registry))
    assert report["model_path"] == str(registry / "v0001" / "model.pt")
    assert report["model_sha256"] == (trained / "model.pt.sha256").read_text().split()[0]
