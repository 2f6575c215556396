"""The gate as its own DAG step: it rewrites the report's decision, and deploy obeys it."""

import hashlib
import json
import shutil

import pytest

from hvd_ctsm.data.schema import SCHEMA_VERSION
from hvd_ctsm.evaluation import backtest, gate

METRICS = {"full": {"ndcg@10": 0.12, "hr@10": 0.2}, "sampled": {"hr@10": 0.6}}


def write_report(path, metrics=METRICS, **fields):
    path.write_text(json.dumps({"model": metrics, "gate": {"passed": None, "checks": []},
                                **fields}))
    return path


def features(path, source):
    """A feature folder as far as the gate reads one: its metadata.json (`source` sets it apart
    from another build's)."""
    path.mkdir(parents=True)
    meta = {"schema_version": SCHEMA_VERSION, "max_len": 10, "vocab": {"items": 5},
            "source": source}
    (path / "metadata.json").write_text(json.dumps(meta))
    return path


def deployed(registry, data, ndcg, weights=b"weights"):
    """REGISTRY/v0001 as deploy writes it: model.pt, a copy of its data's metadata.json, and
    its report (measured on `data`, relative to where the backtest ran)."""
    version = registry / "v0001"
    version.mkdir(parents=True)
    (version / "model.pt").write_bytes(weights)
    shutil.copyfile(data / "metadata.json", version / "metadata.json")
    write_report(version / "backtest.json", {"full": {"ndcg@10": ndcg}}, data="features",
                 split="test", model_path="runs/model/model.pt",
                 model_sha256=hashlib.sha256(weights).hexdigest())
    (registry / "current").write_text("v0001\n")
    return version


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


@pytest.mark.parametrize("tolerance", ["nan", "-1", "inf"])
def test_a_tolerance_that_is_no_allowed_drop_is_bad_input(tmp_path, capsys, tolerance):
    """nan failed every comparison ('gate FAIL ... - nan', exit 1: a refusal of the model for
    a bad argument) and -1 asked to beat the champion; both exit 2 now, the report untouched."""
    report = write_report(tmp_path / "r.json")
    before = report.read_text()
    champion = write_report(tmp_path / "champion.json", {"full": {"ndcg@10": 0.12}})
    args = ["--report", str(report), "--champion", str(champion), "--tolerance", tolerance]
    assert gate.main(args) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "must be a finite number >= 0" in err
    assert report.read_text() == before
    with pytest.raises(ValueError, match="must be a finite number >= 0"):  # before any work
        backtest.main(["--data", "no-data", "--model", "no-model", *args])


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


def test_the_gate_step_refuses_a_champion_measured_on_other_data(tmp_path, capsys, monkeypatch):
    """The champion rule compared the report's full.ndcg@10 with the champion's stored one,
    which another dataset's test targets gave, without a word. The gate step evaluates no model:
    it refuses, naming the backtest; the same build (under another path, written relatively)
    is the same data."""
    old, new = features(tmp_path / "old", "old events"), features(tmp_path / "new", "new")
    champion = write_report(tmp_path / "champion.json", {"full": {"ndcg@10": 0.125}},
                            data=str(old), split="test")
    report = write_report(tmp_path / "r.json", data=str(new), split="test")
    args = ["--report", str(report), "--champion", str(champion), "--tolerance", "0.01"]
    assert gate.main(args) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "measured on other data" in err
    assert "run hvd-ctsm backtest with --champion instead" in err
    assert json.loads(report.read_text())["gate"]["passed"] is None  # nothing decided
    shutil.copytree(old, tmp_path / "copy")
    monkeypatch.chdir(tmp_path)
    write_report(report, data="copy", split="test")
    assert gate.main(args) == 0
    check = json.loads(report.read_text())["gate"]["checks"][-1]
    assert check["champion"]["same_data"] is True and check["value"] == 0.12
    assert check["champion"]["used"] == "its report's score (same data)"
    write_report(report, data="copy", split="validation")  # the same build's other targets
    assert gate.main(args) == 2


def test_a_model_file_as_champion_says_what_champion_takes(tmp_path, capsys):
    """--champion REGISTRY/v0001/model.pt was "'utf-8' codec can't decode byte 0x80"."""
    report = write_report(tmp_path / "r.json")
    version = deployed(tmp_path / "registry", features(tmp_path / "features", "x"), 0.1,
                       weights=b"\x80\x02weights")
    assert gate.main(["--report", str(report), "--champion", str(version / "model.pt")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "codec" not in err
    assert f"not a backtest report (for the model deployed there, name its folder {version})" in err
    assert "--champion takes a registry folder (its current version), a version folder" in err
    with pytest.raises(ValueError, match="--champion takes a registry folder"):
        backtest.main(["--data", "no-data", "--model", "no-model", "--report",
                       str(tmp_path / "b.json"), "--champion", str(version / "model.pt")])


def fake_backtest(evaluated: list):
    """run_backtest without models: the model scores 0.1 on any targets, and so does a champion
    model handed to it (recorded in `evaluated`)."""
    from hvd_ctsm.data.dataset_meta import metadata_sha256, read_metadata

    def run(data, model, split, seed, baseline, champion_model):
        evaluated.append(champion_model)
        scores = {"full": {"ndcg@10": 0.1}}
        report = {"split": split, "data": str(data), "model": scores,
                  "data_sha256": metadata_sha256(read_metadata(data))}
        if champion_model:
            report |= {"champion": scores, "champion_path": str(champion_model),
                       "champion_sha256": hashlib.sha256(b"weights").hexdigest()}
        return report
    return run


def test_a_backtest_compares_with_the_champion_on_its_own_targets(tmp_path, capsys,
                                                                  monkeypatch):
    """The champion deployed from other data (its stored 0.2 came from other targets): the
    backtest evaluates its model.pt on its own targets, says so in one line, and the rule and
    the report use that score. On the same data: its stored score, no evaluation."""
    monkeypatch.chdir(tmp_path)
    registry, evaluated = tmp_path / "registry", []
    version = deployed(registry, features(tmp_path / "features", "old events"), 0.2)
    monkeypatch.setattr(backtest, "run_backtest", fake_backtest(evaluated))
    monkeypatch.setattr(backtest, "print_table", lambda report: None)
    report = tmp_path / "r.json"
    args = ["--model", "run", "--report", str(report), "--champion", str(registry),
            "--tolerance", "0"]
    assert backtest.main(["--data", str(features(tmp_path / "new", "new events")), *args]) == 0
    assert evaluated == [version / "model.pt"]
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith(f"champion: its report ({registry}: full.ndcg@10 0.20000) was "
                           "measured on other data (features, test split); its model was "
                           "evaluated on this backtest's targets")
    check = json.loads(report.read_text())["gate"]["checks"][-1]
    assert check["passed"] and check["rule"] == "full.ndcg@10 >= champion 0.10000 - 0.0"
    assert check["champion"]["stored_ndcg@10"] == 0.2 and check["champion"]["same_data"] is False
    assert check["champion"]["used"] == "its model, evaluated on this backtest's targets"
    # the gate step on that report: the champion's score the backtest measured
    assert gate.main(["--report", str(report), *args[4:]]) == 0
    # the same build the champion was measured on: its stored 0.2, no model evaluated
    assert backtest.main(["--data", "features", *args]) == 1
    assert evaluated[-1] is None
    # other data, and the model it measured is not there any more: refused before the work
    (version / "model.pt").write_bytes(b"retrained")
    with pytest.raises(ValueError, match="the model file it measured .* is neither beside it"):
        backtest.main(["--data", "new", *args])
    assert len(evaluated) == 2


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


def test_a_report_in_the_registry_is_never_rewritten(tmp_path, capsys):
    """`gate --report REGISTRY/v0001/backtest.json` recorded a FAIL in a deployed version (and
    a backtest could replace it): a version never changes after deploy."""
    from hvd_ctsm.files import outputs

    registry = tmp_path / "registry"
    version = deployed(registry, features(tmp_path / "features", "a"), 0.12)
    outputs.mark(registry, "registry")
    before = (version / "backtest.json").read_text()
    assert gate.main(["--report", str(version / "backtest.json"), "--gate", "mrr>0.9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"lies inside the model registry {registry}" in err, err
    with pytest.raises(FileExistsError, match="lies inside the model registry"):
        gate.check_report_path(version / "backtest.json")  # the backtest's check, before work
    assert (version / "backtest.json").read_text() == before


def test_a_negative_seed_is_argparses_one_line_naming_the_option(capsys):
    """--seed -1 was numpy's 'expected non-negative integer', naming nothing."""
    with pytest.raises(SystemExit) as stop:
        backtest.main(["--data", "d", "--model", "m", "--report", "r.json", "--seed", "-1"])
    assert stop.value.code == 2
    assert "argument --seed: -1 is negative" in capsys.readouterr().err
