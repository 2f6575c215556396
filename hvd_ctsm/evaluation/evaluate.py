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

from hvd_ctsm.evaluation.metrics import (RankingSums, auc, hit_at_k, log_loss, ndcg_at_k,
                                         paired_difference, sample_negatives, target_ranks)
from hvd_ctsm.model import catalog

# (batch) -> (its target states' next-item ItemScores, [rows] p(sale) of the target or None)
Scorer = Callable[[dict], tuple["ItemScores", torch.Tensor | None]]


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
            out["sale"] = sale_metrics(labels, probs)
        return out


def sale_metrics(labels: np.ndarray, probs: np.ndarray) -> dict:
    """p(sale) against the labels. AUC ranks sales above non-sales, so it exists only where the
    targets hold both: on purchases-only data every target is a sale (label 1), and the report
    says so (`auc_undefined`) instead of carrying a NaN."""
    labels = np.asarray(labels)
    out = {"log_loss": log_loss(labels, probs), "positive_rate": float(np.mean(labels)),
           "targets": int(len(labels))}
    positives = int(np.sum(labels > 0.5))
    if 0 < positives < len(labels):
        return {"auc": auc(labels, probs), **out}
    label = "a sale (label 1)" if positives else "a non-sale (label 0)"
    return {**out, "auc_undefined": (
        f"every one of the {len(labels)} targets is {label}: AUC needs both kinds; on "
        "purchases-only data p(sale) has nothing to rank (give it views or ratings)")}


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


class ItemScores:
    """Next-item scores of one batch's target states against the catalog, given a chunk at a
    time, so that no [targets x items] matrix need exist: chunk(lo, hi) -> [targets, hi - lo]
    for items lo..hi-1, a tensor of its own (the ranking writes into it); at(items) ->
    [targets, C] for [targets, C] item indices. shared: where every target has the same scores
    (popularity), those [items] scores; the full protocol then ranks by sorting them once."""

    def __init__(self, chunk: Callable[[int, int], torch.Tensor],
                 at: Callable[[torch.Tensor], torch.Tensor], shared: torch.Tensor | None = None):
        self.chunk, self.at, self.shared = chunk, at, shared


def evaluate(batches: Iterable[dict], scorer: Scorer, num_items: int, seed: int = 0,
             negatives: int = 100, keep_ranks: bool = False,
             chunk: int = catalog.ITEM_CHUNK) -> EvalResult:
    """Both protocols' sums (and the sale head's labels and probabilities) over `batches`;
    keep_ranks also keeps each target's ranks, for paired_differences. A catalog of more than
    `chunk` items is ranked chunk by chunk (memory O(targets x chunk))."""
    result = EvalResult()
    targets_so_far: dict[str, int] = {}
    for batch in batches:
        with torch.no_grad():
            scores, p_sale = scorer(batch)
            if num_items <= chunk:
                full_ranks, sampled_ranks = _dense_ranks(batch, scores, num_items, seed,
                                                         negatives)
            else:
                full_ranks = (_shared_full_ranks(batch, scores.shared, num_items)
                              if scores.shared is not None
                              else _chunked_full_ranks(batch, scores, num_items, chunk))
                sampled_ranks = _sampled_ranks(batch, scores, num_items, seed, negatives)
        result.full.add_ranks(full_ranks)
        result.sampled.add_ranks(sampled_ranks)
        if keep_ranks:
            result.ranks["full"].append(full_ranks)
            result.ranks["sampled"].append(sampled_ranks)
            for row in batch["target_row"].numpy():
                client = str(batch["client_id"][row])
                targets_so_far[client] = targets_so_far.get(client, -1) + 1
                result.targets.append((client, targets_so_far[client]))
        if p_sale is not None:
            result.labels.append(batch["target_label"].numpy().astype(np.float64))
            result.probs.append(p_sale.float().cpu().numpy().astype(np.float64))
    return result


def _negatives(batch: dict, row: int, num_items: int, seed: int, negatives: int) -> np.ndarray:
    """The sampled protocol's negatives of a target of `row` (its client's seed)."""
    rng = client_rng(seed, batch["client_id"][row])
    return sample_negatives(rng, num_items, batch["client_items"][row], negatives,
                            allow_fewer=True)


def _dense_ranks(batch, scores: ItemScores, num_items, seed, negatives):
    """Both protocols' ranks from the whole [targets x items] score matrix (a small catalog)."""
    scores = scores.chunk(0, num_items).float().cpu().numpy()
    targets, rows = batch["target_item"].numpy(), batch["target_row"].numpy()
    target_scores = scores[np.arange(len(targets)), targets]
    masked = scores.copy()
    for t, row in enumerate(rows):
        masked[t, batch["prior_items"][row]] = -np.inf
        masked[t, 0] = -np.inf
    masked_target = masked[np.arange(len(targets)), targets]
    # A masked (repeat) target scores -inf and ranks last among the rest.
    full_ranks = np.where(np.isneginf(masked_target), num_items - 2,
                          target_ranks(masked, masked_target))
    sampled = [target_ranks(scores[t, _negatives(batch, row, num_items, seed, negatives)][None],
                            target_scores[t:t + 1])[0] + 1 for t, row in enumerate(rows)]
    return full_ranks, np.asarray(sampled)


def _chunked_full_ranks(batch: dict, scores: ItemScores, num_items: int,
                        chunk: int) -> np.ndarray:
    """The full protocol's ranks, as _dense_ranks gives them, a chunk of items at a time.

    The target's score is read from its own chunk; until then each chunk counts the items
    surely above it (above an estimate plus a margin) and keeps the few near it, which are
    settled once the exact score is known: the same comparisons as on the whole matrix. The
    scores are float32 and compared as such (float64 copies of them order the same); the
    margin's bounds are rounded outwards to float32, so 'surely' stays sure."""
    targets = batch["target_item"]
    prior = catalog.ItemPairs.from_lists(  # what each target's client had before it
        [batch["prior_items"][row] for row in batch["target_row"].numpy()], num_items)
    repeat = prior.contains(torch.arange(len(targets)), targets)  # ranks last: num_items - 2
    prior = prior.by_item()
    estimate = scores.at(targets.unsqueeze(1)).squeeze(1).double()
    margin = 1e-4 * (estimate.abs() + 1)
    upper = _float32_outwards(estimate + margin, up=True).unsqueeze(1)
    lower = _float32_outwards(estimate - margin, up=False).unsqueeze(1)
    above = torch.zeros(len(targets), dtype=torch.long)
    exact = torch.full((len(targets),), float("nan"))
    near_rows, near_values = [], []
    rows = torch.arange(len(targets))
    for lo in range(0, num_items, chunk):
        hi = min(lo + chunk, num_items)
        block = scores.chunk(lo, hi).float()
        here = (targets >= lo) & (targets < hi)
        exact[here] = block[rows[here], targets[here] - lo]
        block[rows[here], targets[here] - lo] = -np.inf  # the target is not its own rival
        prior_rows, prior_cols = prior.in_chunk(lo, hi)
        block[prior_rows, prior_cols] = -np.inf
        if lo == 0:
            block[:, 0] = -np.inf
        above += (block > upper).sum(1)
        near_row, near_col = ((block >= lower) & (block <= upper)).nonzero(as_tuple=True)
        near_rows.append(near_row)
        near_values.append(block[near_row, near_col])
    near_row, near_value = torch.cat(near_rows), torch.cat(near_values)
    settled = torch.zeros(len(targets), dtype=torch.long).index_add_(
        0, near_row, (near_value >= exact[near_row]).long())
    if ((exact.double() - estimate).abs() > margin).any():  # the pair and chunk scores disagree
        raise RuntimeError("a target's chunk score is off its pair score by more than the "
                           "ranking margin: rank with a chunk as large as the catalog")
    return np.where(repeat.numpy(), num_items - 2, (above + settled).numpy())


def _float32_outwards(values: torch.Tensor, up: bool) -> torch.Tensor:
    """float64 values as the nearest float32 at or above them (up) or at or below them."""
    rounded = values.float()
    off = rounded.double() < values if up else rounded.double() > values
    return torch.where(off, torch.nextafter(rounded, torch.tensor(np.inf if up else -np.inf)),
                       rounded)


def _shared_full_ranks(batch: dict, shared: torch.Tensor, num_items: int) -> np.ndarray:
    """The full protocol's ranks, as _dense_ranks gives them, where every target has the same
    [items] scores (popularity): the items at or above the target's score, counted in the
    sorted scores, less those its ranking leaves out (the target, item 0, the client's earlier
    items). No [targets x items] block: a catalog of 10^6 items costs one sort."""
    scores = shared.float().numpy()  # float32, as the chunked and dense paths compare them
    ordered = np.sort(scores)
    ranks = np.empty(len(batch["target_item"]), dtype=np.int64)
    for t, (target, row) in enumerate(zip(batch["target_item"].numpy(),
                                          batch["target_row"].numpy(), strict=True)):
        prior = np.asarray(batch["prior_items"][row], dtype=np.int64)
        if target in prior:  # a repeat ranks last, as everywhere
            ranks[t] = num_items - 2
            continue
        left_out = np.unique(np.concatenate([[target, 0], prior]))
        at_or_above = len(ordered) - np.searchsorted(ordered, scores[target], side="left")
        ranks[t] = at_or_above - (scores[left_out] >= scores[target]).sum()
    return ranks


def _sampled_ranks(batch, scores: ItemScores, num_items, seed, negatives) -> np.ndarray:
    """The sampled protocol's ranks: the target against its client's drawn negatives, scored
    pair by pair (no catalog-wide row)."""
    targets, rows = batch["target_item"], batch["target_row"].numpy()
    drawn = [_negatives(batch, row, num_items, seed, negatives) for row in rows]
    width = max((len(d) for d in drawn), default=0)
    padded = torch.zeros(len(rows), width + 1, dtype=torch.long)
    valid = torch.zeros(len(rows), width + 1, dtype=torch.bool)
    padded[:, 0] = targets
    for t, items in enumerate(drawn):
        padded[t, 1:len(items) + 1] = torch.from_numpy(items)
        valid[t, 1:len(items) + 1] = True
    candidate_scores = scores.at(padded).float().double()  # as the dense path compares them
    beaten = (candidate_scores[:, 1:] >= candidate_scores[:, :1]) & valid[:, 1:]
    return beaten.sum(1).numpy()  # as _dense_ranks: the count of negatives at or above it


def model_scorer(model, device: torch.device) -> Scorer:
    """Scores from a CTSM: next-item scores (ItemScores) and p(sale) of the target item. The
    catalog's item vectors are built once per scorer (the model does not change under it)."""
    table: list[torch.Tensor] = []

    def vectors() -> torch.Tensor:
        if not table:
            table.append(catalog.item_table(model.encoder))
        return table[0]

    def score(batch: dict):
        tensors = {k: v.to(device) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        states = model.states_at(tensors)
        bias = model.heads["next_item"].bias
        item_scores = ItemScores(
            chunk=lambda lo, hi: (states @ vectors()[lo:hi].T + bias[lo:hi]).cpu(),
            at=lambda items: model.score(states, items.to(device)).cpu())
        p_sale = None
        if "sale" in model.heads:
            p_sale = model.p_sale(states, tensors["target_item"], tensors["target_log_dt"])
        return item_scores, p_sale

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
            item_scores = ItemScores(chunk=lambda lo, hi: scores[lo:hi].expand(n, -1),
                                     at=lambda ids: scores[ids], shared=scores)
            return item_scores, torch.from_numpy(self.positive_rate[items])

        return score
