"""Which split batch scoring reads (pure: a metadata.json, no Spark, no model)."""

import json
import logging

import pytest

from hvd_ctsm.data.dataset import Dataset
from hvd_ctsm.data.schema import SCHEMA_VERSION
from hvd_ctsm.serving.score import ScoringError, scoring_split


def features(path, *splits):
    path.mkdir()
    meta = {"schema_version": SCHEMA_VERSION, "max_len": 10, "vocab": {"items": 5},
            "splits": {name: {"rows": 1} for name in splits}}
    (path / "metadata.json").write_text(json.dumps(meta))
    return Dataset.open(path)


def test_serving_rows_are_scored_when_the_features_have_them(tmp_path, caplog):
    data = features(tmp_path / "new", "train", "validation", "test", "serving")
    with caplog.at_level(logging.WARNING, logger="hvd_ctsm.serving.score"):
        assert scoring_split(data) == "serving"
        assert scoring_split(data, "test") == "test"  # asked for on purpose: no warning
    assert not caplog.records


def test_older_features_fall_back_to_test_with_a_warning(tmp_path, caplog):
    data = features(tmp_path / "old", "train", "validation", "test")
    with caplog.at_level(logging.WARNING, logger="hvd_ctsm.serving.score"):
        assert scoring_split(data) == "test"
    assert len(caplog.records) == 1
    assert "last event" in caplog.text and "rebuild the features" in caplog.text
    with pytest.raises(ScoringError, match="no 'serving' split.*rebuild the features"):
        scoring_split(data, "serving")
    with pytest.raises(ScoringError, match="cannot score from 'train'"):
        scoring_split(data, "train")  # training windows are not one row per client


def test_a_registry_before_its_first_deploy_says_so(tmp_path):
    """An empty registry folder: the message says to deploy first; a missing path, a plain
    'no model'."""
    from hvd_ctsm.serving.score import resolve_model

    (tmp_path / "registry").mkdir()
    with pytest.raises(ScoringError, match="a registry before its first deploy"):
        resolve_model(tmp_path / "registry")
    with pytest.raises(ScoringError, match="no model at .*missing: pass a registry"):
        resolve_model(tmp_path / "missing")


SUMMARY = {"clients": 943, "scored_clients": 943, "rows": 9412, "short": 2, "k": 10,
           "split": "serving", "out": "runs/scores.parquet", "seconds": 2.34}


def test_a_scorer_says_what_it_scored_in_a_sentence_or_with_json_in_one_json_line(capsys):
    from hvd_ctsm.serving.score import say_scored

    say_scored(SUMMARY, as_json=False)
    assert capsys.readouterr().out == (
        "scored 943 of 943 clients from the serving split, top-10 each (9,412 rows), into "
        "runs/scores.parquet in 2.3 s; 2 of them got fewer than 10 (every item they had not "
        "seen)\n")
    say_scored({**SUMMARY, "short": 0, "table": "main.scores"} | {"seconds": 1.0}, False)
    assert capsys.readouterr().out.endswith("into main.scores in 1.0 s\n")
    say_scored(SUMMARY, as_json=True)
    assert json.loads(capsys.readouterr().out) == SUMMARY
