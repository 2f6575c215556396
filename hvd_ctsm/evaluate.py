"""Offline evaluation of next-item ranking and the p(sale) head, shared by training and backtest.

Two ranking protocols, both reported:
- full: the target ranked against every item; items the client interacted with before the target
  are removed (a repeat target then counts as a miss: pessimistic, never flattering);
- sampled: the target against 100 items the client never interacted with (all of them when a
  small catalogue has fewer), drawn with a seed that depends only on (seed, client), so the
  result does not depend on sharding.
Binary head: AUC and log-loss of p(sale) for the target (client, item) pairs.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from hvd_ctsm.metrics import (RankingSums, auc, hit_at_k, log_loss, ndcg_at_k, paired_difference,
                              sample_negatives, target_ranks)

# (batch) -> ([rows, num_items] next-item scores, [rows] p(sale) of the target item or None)
Scorer = Callable[[dict], tuple[torch.Tensor, torch.Tensor | None]]


@dataclass
class EvalResult:
    full: RankingSums = field(default_factory=RankingSums)
    sampled: RankingSums = field(default_factory=RankingSums)
    labels: list[np.ndarray] = field(default_factory=list)
    probs: list[np.ndarray] = field(default_factory=list)
    # With evaluate(keep_ranks=True): each target as (client, its n-th target) and its ranks.
    targets: list[tuple[str, int]] = field(default_factory=list)
    ranks: dict[str, list[np.ndarray]] = field(
        default_factory=lambda: {"full": [], "sampled": []})

    def ranking_vector(self) -> list[float]:
        """Sums and counts of both protocols, to be added across ranks."""
        return self.full.as_vector() + self.sampled.as_vector()

    def summary(self, ranking_vector=None, labels=None, probs=None) -> dict:
        """Metrics from (possibly all-rank) sums, labels and probabilities."""
        vector = self.ranking_vector() if ranking_vector is None else list(ranking_vector)
        n = len(self.full.as_vector())
        out = {"full": self.full.means_from_vector(vector[:n]),
               "sampled": self.sampled.means_from_vector(vector[n:])}
        if labels is None:  # a model without a sale head (the SASRec baseline) has none
            labels = np.concatenate(self.labels) if self.labels else np.zeros(0)
        if probs is None:
            probs = np.concatenate(self.probs) if self.probs else np.zeros(0)
        if len(probs):
            out["sale"] = {"auc": auc(labels, probs), "log_loss": log_loss(labels, probs),
                           "positive_rate": float(np.mean(labels)), "targets": int(len(labels))}
        return out


# The per-target metrics that paired_differences compares: (protocol, metric, function of ranks).
PAIRED_METRICS = (("full", "ndcg@10", lambda r: ndcg_at_k(r, 10)),
                  ("full", "hr@10", lambda r: hit_at_k(r, 10)),
                  ("sampled", "ndcg@10", lambda r: ndcg_at_k(r, 10)),
                  ("sampled", "hr@10", lambda r: hit_at_k(r, 10)))


def paired_differences(ours: EvalResult, other: EvalResult, seed: int = 0) -> dict:
    """ours - other for each PAIRED_METRICS entry, paired target by target, with a 95% bootstrap
    interval over clients (metrics.paired_difference). Both must come from evaluate(...,
    keep_ranks=True) on the same targets (the same data and split)."""
    if not ours.targets or sorted(ours.targets) != sorted(other.targets):
        raise ValueError("paired differences need two evaluations of the same targets")
    order = {key: i for i, key in enumerate(other.targets)}
    align = np.array([order[key] for key in ours.targets])
    clients = np.array([client for client, _ in ours.targets])
    out = {}
    for protocol, metric, per_target in PAIRED_METRICS:
        mine = per_target(np.concatenate(ours.ranks[protocol]))
        theirs = per_target(np.concatenate(other.ranks[protocol]))[align]
        out[f"{protocol}.{metric}"] = paired_difference(mine, theirs, clients, seed=seed)
    return out


def client_rng(seed: int, client_id: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(client_id.encode())])


def evaluate(batches: Iterable[dict], scorer: Scorer, num_items: int, seed: int = 0,
             negatives: int = 100, keep_ranks: bool = False) -> EvalResult:
    """Both protocols' sums (and the sale head's labels and probabilities) over `batches`;
    keep_ranks also keeps each target's ranks, for paired_differences."""
    result = EvalResult()
    targets_so_far: dict[str, int] = {}
    for batch in batches:
        with torch.no_grad():
            scores, p_sale = scorer(batch)
        scores = scores.float().cpu().numpy().copy()
        targets = batch["target_item"].numpy()
        rows = batch["target_row"].numpy()
        # One score row per target (the scorers work on the target positions' states).
        target_scores = scores[np.arange(len(targets)), targets]
        masked = scores.copy()
        for t, row in enumerate(rows):
            masked[t, batch["prior_items"][row]] = -np.inf
            masked[t, 0] = -np.inf
        masked_target = masked[np.arange(len(targets)), targets]
        # A masked (repeat) target scores -inf and ranks last among the rest.
        full_ranks = np.where(np.isneginf(masked_target), num_items - 2,
                              target_ranks(masked, masked_target))
        result.full.add_ranks(full_ranks)
        sampled_ranks = []
        for t, row in enumerate(rows):
            rng = client_rng(seed, batch["client_id"][row])
            negs = sample_negatives(rng, num_items, batch["client_items"][row], negatives,
                                    allow_fewer=True)
            sampled_ranks.append(target_ranks(scores[t, negs][None, :],
                                              target_scores[t:t + 1])[0] + 1)
        result.sampled.add_ranks(np.asarray(sampled_ranks))
        if keep_ranks:
            result.ranks["full"].append(full_ranks)
            result.ranks["sampled"].append(np.asarray(sampled_ranks))
            for row in rows:
                client = str(batch["client_id"][row])
                targets_so_far[client] = targets_so_far.get(client, -1) + 1
                result.targets.append((client, targets_so_far[client]))
        if p_sale is not None:
            result.labels.append(batch["target_label"].numpy().astype(np.float64))
            result.probs.append(p_sale.float().cpu().numpy().astype(np.float64))
    return result


def model_scorer(model, device: torch.device) -> Scorer:
    """Scores from a CTSM: next-item scores for all items and p(sale) of the target item."""

    def score(batch: dict):
        tensors = {k: v.to(device) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        states = model.states_at(tensors)
        full = model.score(states)
        p_sale = None
        if "sale" in model.heads:
            p_sale = model.p_sale(states, tensors["target_item"], tensors["target_log_dt"])
        return full, p_sale

    return score


@dataclass
class Popularity:
    """The baseline: items ranked by how often they were targets in training; p(sale) = the
    item's smoothed positive rate in training."""

    counts: np.ndarray
    positive_rate: np.ndarray

    @classmethod
    def fit(cls, batches: Iterable[dict], num_items: int, prior_weight: float = 10.0):
        counts = np.zeros(num_items)
        positives = np.zeros(num_items)
        for batch in batches:
            items = batch["target_item"].numpy()
            np.add.at(counts, items, 1.0)
            np.add.at(positives, items, batch["target_label"].numpy())
        global_rate = positives.sum() / max(counts.sum(), 1.0)
        rate = (positives + prior_weight * global_rate) / (counts + prior_weight)
        return cls(counts=counts, positive_rate=rate)

    def scorer(self) -> Scorer:
        # A tiny tie-break by item index keeps the ranking a strict order.
        scores = torch.from_numpy(np.log1p(self.counts) - 1e-9 * np.arange(len(self.counts)))

        def score(batch: dict):
            n = len(batch["target_item"])
            items = batch["target_item"].numpy()
            return scores.expand(n, -1), torch.from_numpy(self.positive_rate[items])

        return score
