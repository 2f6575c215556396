"""Backtest report, gate exit codes and the deploy that only follows a passed gate.
This file holds the unit-tier part; the rest is in tests/integration/test_backtest_deploy.py."""

import pytest

from hvd_ctsm.evaluation import gate


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
