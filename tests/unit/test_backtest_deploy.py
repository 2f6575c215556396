"""Backtest report, gate exit codes and the deploy that only follows a passed gate.
This file holds the unit-tier part; the rest is in tests/integration/test_backtest_deploy.py."""

import pytest

from hvd_ctsm.evaluation import backtest, gate


def test_gate_parsing_and_decisions():
    rules = gate.parse_gate("ndcg@10>=0.1, sampled.hr@10>0.5,sale.auc>=0.6")
    assert rules == [("full", "ndcg@10", ">=", 0.1), ("sampled", "hr@10", ">", 0.5),
                     ("sale", "auc", ">=", 0.6)]
    metrics = {"full": {"ndcg@10": 0.12}, "sampled": {"hr@10": 0.5}, "sale": {"auc": 0.7}}
    decision = gate.apply_gate(metrics, rules, None, 0.0)
    assert decision["passed"] is False
    assert [c["passed"] for c in decision["checks"]] == [True, False, True]
    champion = {"model": {"full": {"ndcg@10": 0.125}}}
    assert gate.apply_gate(metrics, [], champion, 0.01)["passed"] is True
    assert gate.apply_gate(metrics, [], champion, 0.001)["passed"] is False


@pytest.mark.parametrize("bad", ["ndcg@10=>0.1", "foo.ndcg@10>=1", "ndcg@10>=x"])
def test_malformed_gate_is_refused(bad):
    with pytest.raises(ValueError, match="gate"):
        gate.parse_gate(bad)


def test_the_report_table_says_n_a_and_why_where_p_sale_has_no_auc(capsys):
    ranking = {"full": {"ndcg@10": 0.1, "hr@10": 0.2, "mrr": 0.05},
               "sampled": {"ndcg@10": 0.4, "hr@10": 0.6}}
    sale = {"log_loss": 0.3, "positive_rate": 1.0, "targets": 9,
            "auc_undefined": "every one of the 9 targets is a sale (label 1): ..."}
    backtest.print_table({"model": {**ranking, "sale": sale}, "popularity": ranking})
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split("|")[-1].strip() == "n/a" and "nan" not in "\n".join(lines)
    assert lines[-1] == "AUC n/a: every one of the 9 targets is a sale (label 1): ..."



def test_a_long_backtest_says_how_far_it_is_and_passes_every_batch_on(capsys):
    from hvd_ctsm.progress import with_progress

    batches = [{"client_id": ["a"] * 256}, {"client_id": ["b"] * 256}, {"client_id": ["c"] * 88}]
    size = lambda batch: len(batch["client_id"])  # noqa: E731
    said = with_progress(iter(batches), 600, "backtest: model", "clients ranked", size, 0.0)
    assert list(said) == batches
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("backtest: model: 256 of 600 clients ranked")
    assert lines[-1].startswith("backtest: model: 600 of 600 clients ranked")
    assert lines[-1].endswith("about 0 s left")
    quick = with_progress(iter(batches), 600, "backtest: model", "clients ranked", size)
    assert list(quick) == batches
    assert capsys.readouterr().err == ""  # under 30 s: quiet


def test_deploy_refuses_a_gate_passed_on_the_validation_split(tmp_path):
    """A validation-split report (the split that picked the model's epoch) was deployed, and
    moved MLflow's champion, without a word."""
    import hashlib

    import pytest

    from hvd_ctsm.serving.deploy import DeployRefused, check_report

    model = tmp_path / "model.pt"
    model.write_bytes(b"weights")
    report = {"split": "validation", "gate": {"passed": True, "checks": []},
              "model_sha256": hashlib.sha256(b"weights").hexdigest()}
    with pytest.raises(DeployRefused, match="passed on the validation split"):
        check_report(report, model)
    check_report(report | {"split": "test"}, model)  # the test split's report: deployed
