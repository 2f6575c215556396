"""Ranking and classification metrics against hand-computed values."""

import math

import numpy as np
import pytest

from hvd_ctsm.metrics import (RankingSums, auc, hit_at_k, log_loss, ndcg_at_k, reciprocal_rank,
                              sample_negatives, target_ranks)


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
    from hvd_ctsm.evaluate import EvalResult

    result = EvalResult()
    result.full.add_ranks(np.array([0]))  # the target first
    result.sampled.add_ranks(np.array([1]))  # the target second
    summary = result.summary()
    assert summary["full"]["hr@10"] == 1.0 and summary["sampled"]["mrr"] == 0.5
    assert "sale" not in summary
