"""The gate as its own DAG step: it rewrites the report's decision, and deploy obeys it."""

import json

import pytest

from hvd_ctsm.evaluation import backtest, gate

METRICS = {"full": {"ndcg@10": 0.12, "hr@10": 0.2}, "sampled": {"hr@10": 0.6}}


def write_report(path, metrics=METRICS, **fields):
    path.write_text(json.dumps({"model": metrics, "gate": {"passed": None, "checks": []},
                                **fields}))
    return path


def test_gate_step_passes_refuses_and_records_its_decision(tmp_path):
    report = write_report(tmp_path / "r.json")
    assert gate.main(["--report", str(report), "--gate", "ndcg@10>=0.1,sampled.hr@10>0.5"]) == 0
    decision = json.loads(report.read_text())["gate"]
    assert decision["passed"] is True and len(decision["checks"]) == 2
    assert gate.main(["--report", str(report), "--gate", "ndcg@10>=0.13"]) == 1
    assert json.loads(report.read_text())["gate"]["passed"] is False
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left


def test_gate_step_against_a_champion(tmp_path):
    report = write_report(tmp_path / "r.json")
    champion = write_report(tmp_path / "champion.json", {"full": {"ndcg@10": 0.125}})
    args = ["--report", str(report), "--gate", "", "--champion", str(champion)]
    assert gate.main([*args, "--tolerance", "0.01"]) == 0
    assert gate.main([*args, "--tolerance", "0.001"]) == 1
    assert gate.main(args[:2] + args[4:] + ["--tolerance", "0.01"]) == 0  # no --gate: the champion


def test_the_champion_is_read_from_a_registry_or_a_version_folder(tmp_path, capsys):
    """--champion REGISTRY reads its current version's report (`current` is a file naming the
    version, not a folder); a folder with no deployed report is one line and exit 2."""
    report = write_report(tmp_path / "r.json")
    registry = tmp_path / "registry"
    (registry / "v0001").mkdir(parents=True)
    (registry / "v0002").mkdir()
    write_report(registry / "v0001" / "backtest.json", {"full": {"ndcg@10": 0.2}})
    write_report(registry / "v0002" / "backtest.json", {"full": {"ndcg@10": 0.125}})
    (registry / "current").write_text("v0002\n")
    args = ["--report", str(report), "--gate", "", "--tolerance", "0.01", "--champion"]
    assert gate.main([*args, str(registry)]) == 0  # v0002's 0.125, within 0.01
    assert gate.main([*args, str(registry / "v0001")]) == 1  # 0.2: worse than that one
    capsys.readouterr()
    assert gate.main([*args, str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err.strip().endswith("empty not found; check the path")
    (tmp_path / "empty").mkdir()
    assert gate.main([*args, str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "leave --champion out until the first deploy" in err and len(err.splitlines()) == 1


def test_a_model_file_as_champion_says_what_champion_takes(tmp_path, capsys):
    """--champion REGISTRY/v0001/model.pt was "'utf-8' codec can't decode byte 0x80"."""
    report = write_report(tmp_path / "r.json")
    version = tmp_path / "registry" / "v0001"
    version.mkdir(parents=True)
    (version / "model.pt").write_bytes(b"\x80\x02weights")
    write_report(version / "backtest.json", {"full": {"ndcg@10": 0.1}})
    assert gate.main(["--report", str(report), "--champion", str(version / "model.pt")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "codec" not in err
    assert f"not a backtest report (for the model deployed there, name its folder {version})" in err
    assert "--champion takes a registry folder (its current version), a version folder" in err
    with pytest.raises(ValueError, match="--champion takes a registry folder"):
        backtest.main(["--data", "no-data", "--model", "no-model", "--report",
                       str(tmp_path / "b.json"), "--champion", str(version / "model.pt")])


def test_malformed_gate_or_report_exits_2_and_keeps_the_report(tmp_path):
    report = write_report(tmp_path / "r.json")
    before = report.read_text()
    assert gate.main(["--report", str(report), "--gate", "ndcg@10=>0.1"]) == 2
    with pytest.raises(ValueError, match="no metric 'ndgc@10' in the full protocol; one of "
                                         "ndcg@5, ndcg@10"):
        gate.parse_gate("ndgc@10>=0.05")  # a typo: refused before a backtest runs, not after
    assert gate.main(["--report", str(report), "--gate", ""]) == 2
    assert gate.main(["--report", str(tmp_path / "missing.json"), "--gate", "mrr>0"]) == 2
    assert report.read_text() == before


def test_a_report_replaces_only_a_report(tmp_path):
    """backtest --report over a user's file was a silent replace; now refused before any work
    (the data and model here do not exist: the report's check comes first)."""
    from hvd_ctsm.evaluation import backtest

    notes = tmp_path / "notes.json"
    notes.write_text('{"my": "notes"}')
    args = ["--data", str(tmp_path / "no-data"), "--model", str(tmp_path / "no-model")]
    for path in (notes, tmp_path):
        with pytest.raises(ValueError, match="it is not a backtest report; pick another"):
            backtest.main([*args, "--report", str(path)])
    assert notes.read_text() == '{"my": "notes"}'
    gate.check_report_path(tmp_path / "new.json")  # absent: fine
    gate.check_report_path(write_report(tmp_path / "earlier.json"))  # an earlier report: fine


def test_the_notebook_backtest_replaces_only_a_report_and_names_the_splits(tmp_path):
    """backtest_model(report=...) wrote over any file, a dataset's metadata.json included, which
    left the dataset unreadable."""
    from hvd_ctsm.api import backtest_model
    from hvd_ctsm.evaluation.backtest import run_backtest

    metadata = tmp_path / "metadata.json"
    metadata.write_text('{"schema_version": 1}')
    with pytest.raises(ValueError, match="it is not a backtest report"):
        backtest_model(tmp_path / "no-data", tmp_path / "no-model", report=metadata)
    assert metadata.read_text() == '{"schema_version": 1}'
    with pytest.raises(ValueError, match="split must be one of test, validation, got 'serving'"):
        run_backtest(tmp_path / "no-data", tmp_path / "no-model", "serving")
