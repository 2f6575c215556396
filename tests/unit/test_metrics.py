"""Ranking and classification metrics against hand-computed values."""

import math

import numpy as np
import pytest

from hvd_ctsm.evaluation.metrics import (RankingSums, auc, hit_at_k, log_loss, ndcg_at_k,
                                         reciprocal_rank, sample_negatives, target_ranks)


def test_target_ranks_ties_count_against_the_target():
    scores = np.array([[0.1, 0.9, 0.5], [1.0, 1.0, 1.0]])
    assert target_ranks(scores, [0.5, 1.0]).tolist() == [1, 2]


def test_ndcg_hr_mrr_by_hand():
    ranks = np.array([0, 1, 4, 10])
    assert ndcg_at_k(ranks, 5).tolist() == pytest.approx([1.0, 1 / math.log2(3),
                                                          1 / math.log2(6), 0.0])
    assert hit_at_k(ranks, 5).tolist() == [1, 1, 1, 0]
    assert reciprocal_rank(ranks).tolist() == pytest.approx([1, 0.5, 0.2, 1 / 11])


def test_sums_combine_exactly_across_shards():
    ranks = np.array([0, 3, 7, 12, 2])
    whole = RankingSums()
    whole.add_ranks(ranks)
    a, b = RankingSums(), RankingSums()
    a.add_ranks(ranks[:1])
    b.add_ranks(ranks[1:])
    combined = np.add(a.as_vector(), b.as_vector())
    assert a.means_from_vector(combined) == pytest.approx(whole.means())
    # An average of per-shard averages would be wrong here (shards of 1 and 4 targets).
    wrong = (a.means()["ndcg@10"] + b.means()["ndcg@10"]) / 2
    assert wrong != pytest.approx(whole.means()["ndcg@10"])


def test_auc_by_hand_with_ties():
    assert auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    assert auc([0, 1], [0.5, 0.5]) == pytest.approx(0.5)
    assert math.isnan(auc([1, 1], [0.2, 0.3]))


def test_log_loss_by_hand():
    assert log_loss([1, 0], [0.8, 0.4]) == pytest.approx(-(math.log(0.8) + math.log(0.6)) / 2)


def test_sample_negatives_excludes_and_is_distinct():
    rng = np.random.default_rng(0)
    negs = sample_negatives(rng, 20, np.array([1, 2, 3]), 16)
    assert len(set(negs)) == 16 and not set(negs) & {0, 1, 2, 3}
    with pytest.raises(ValueError, match="only 16 items"):
        sample_negatives(rng, 20, np.array([1, 2, 3]), 17)


def test_a_model_without_a_sale_head_gets_ranking_metrics_and_no_auc():
    from hvd_ctsm.evaluation.evaluate import EvalResult

    result = EvalResult()
    result.full.add_ranks(np.array([0]))  # the target first
    result.sampled.add_ranks(np.array([1]))  # the target second
    summary = result.summary()
    assert summary["full"]["hr@10"] == 1.0 and summary["sampled"]["mrr"] == 0.5
    assert "sale" not in summary


def test_paired_difference_of_a_constant_gap_is_exact_whatever_the_clients_spread():
    from hvd_ctsm.evaluation.metrics import paired_difference

    rng = np.random.default_rng(0)
    theirs = rng.uniform(0, 1, 500)  # clients differ a lot; the gap between models does not
    gap = paired_difference(theirs + 0.02, theirs, np.arange(500))
    assert gap["mean"] == pytest.approx(0.02)
    assert gap["low"] == pytest.approx(0.02) and gap["high"] == pytest.approx(0.02)
    same = paired_difference(theirs, theirs, np.arange(500))
    assert same["mean"] == same["low"] == same["high"] == 0.0


def test_paired_difference_resamples_clients_and_narrows_with_more_of_them():
    from hvd_ctsm.evaluation.metrics import paired_difference

    rng = np.random.default_rng(1)

    def width(clients):
        ours, theirs = rng.uniform(0, 1, (2, 2 * clients))
        d = paired_difference(ours, theirs, np.repeat(np.arange(clients), 2))
        assert d["low"] <= d["mean"] <= d["high"] and d["groups"] == clients
        assert d["targets"] == 2 * clients
        return d["high"] - d["low"]

    few, many = width(100), width(1600)
    assert 2.5 < few / many < 6  # about sqrt(16) = 4
    with pytest.raises(ValueError, match="one shape"):
        paired_difference(np.zeros(3), np.zeros(4), np.arange(3))
    with pytest.raises(ValueError, match="no paired values"):
        paired_difference(np.zeros(0), np.zeros(0), np.zeros(0))


def test_paired_differences_pair_each_target_with_itself_whatever_the_order():
    from hvd_ctsm.evaluation.evaluate import EvalResult, paired_differences

    def result(targets, full, sampled):
        r = EvalResult()
        r.targets = targets
        r.ranks = {"full": [np.array(full)], "sampled": [np.array(sampled)]}
        return r

    keys = [("a", 0), ("a", 1), ("b", 0), ("c", 0)]
    ours = result(keys, [0, 3, 50, 7], [0, 1, 2, 3])
    # The same ranks listed in the other order: paired target by target, nothing differs.
    same = paired_differences(ours, result(keys[::-1], [7, 50, 3, 0], [3, 2, 1, 0]))
    assert all(d["mean"] == d["low"] == d["high"] == 0.0 for d in same.values())
    # Each target one place lower in the other model (again listed the other way round).
    lower = paired_differences(ours, result(keys[::-1], [8, 51, 4, 1], [4, 3, 2, 1]))
    expected = np.mean(ndcg_at_k(np.array([0, 3, 50, 7]), 10)
                       - ndcg_at_k(np.array([1, 4, 51, 8]), 10))
    assert lower["full.ndcg@10"]["mean"] == pytest.approx(expected)
    assert lower["full.hr@10"]["mean"] == 0.0  # all four stay in (or out of) the top 10
    assert lower["sampled.hr@10"]["groups"] == 3  # a's two targets are resampled together
    with pytest.raises(ValueError, match="same targets"):
        paired_differences(ours, result(keys[:3], [0, 0, 0], [0, 0, 0]))


@pytest.mark.parametrize("num_items", [30, 1682, 200_000])
def test_sample_negatives_draws_what_a_choice_among_the_listed_allowed_items_draws(num_items):
    """The same items as rng.choice(allowed) over the listed allowed items (the definition, and
    what every earlier backtest drew), without listing them."""
    exclude = np.random.default_rng(1).integers(0, num_items, size=min(400, num_items // 2))
    allowed = np.setdiff1d(np.arange(1, num_items), exclude)
    n = min(100, len(allowed))
    expected = np.random.default_rng([5, 9]).choice(allowed, size=n, replace=False)
    drawn = sample_negatives(np.random.default_rng([5, 9]), num_items, exclude, n)
    assert np.array_equal(drawn, expected)


def test_p_sale_on_purchases_only_data_says_why_it_has_no_auc_instead_of_a_nan():
    """Issue: AUC was `nan` in the report on purchases-only data (every target a sale)."""
    from hvd_ctsm.evaluation.evaluate import sale_metrics
    from hvd_ctsm.evaluation.gate import apply_gate

    probs = np.array([0.9, 0.2, 0.7, 0.4])
    mixed = sale_metrics(np.array([1.0, 0.0, 1.0, 0.0]), probs)
    assert mixed["auc"] == 1.0 and "auc_undefined" not in mixed
    only_sales = sale_metrics(np.ones(4), probs)
    assert "auc" not in only_sales and only_sales["positive_rate"] == 1.0
    assert "every one of the 4 targets is a sale" in only_sales["auc_undefined"]
    assert math.isfinite(only_sales["log_loss"])
    metrics = {"full": {"ndcg@10": 0.2}, "sale": only_sales}
    with pytest.raises(ValueError, match="sale.auc is undefined on this data .* drop that rule"):
        apply_gate(metrics, [("sale", "auc", ">=", 0.6)], None, 0.0)
    assert apply_gate(metrics, [("full", "ndcg@10", ">=", 0.1)], None, 0.0)["passed"] is True
