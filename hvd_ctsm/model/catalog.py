"""What grows with the item catalog, computed so that no tensor is [targets x items].

The next-item loss, evaluation and scoring all compare client states with every item. Done
densely, each builds [targets x items] tensors: at 10^6 items one batch's logits alone are
gigabytes. Here the same results come from index pairs and item chunks instead:
- ItemPairs: which items are no negatives of which target (the items a client already had, the
  targets tied with it), as (target, item) index pairs rather than a [targets x items] mask;
- softmax_cross_entropy: the exact full-softmax loss, its logits made in blocks of rows
  (candidate_cross_entropy), each block's gradient with them, memory O(rows x items) a block;
- shared_sampled_softmax: a sampled softmax whose cost does not grow with the catalog, over
  negatives shared by the whole batch (the batch's own targets plus uniform draws), each logit
  corrected by the log of its expected count in the sample (log-Q; Yi et al. 2019, "Sampling-
  Bias-Corrected Neural Modeling for Large Corpus Item Recommendations");
- chunked_topk: each row's top-K over the catalog with a running merge, excluded items left out.
Plain PyTorch, like the model, which imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

# Items per chunk: [targets x chunk] floats at a time (3,000 targets x 8,192 items: 98 MB).
ITEM_CHUNK = 8192

# (item ids [C]) -> [C, dim] item vectors, with their gradient path (the encoder's item_vectors).
Vectors = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class ItemPairs:
    """Sparse (target, item) pairs: `item` is no negative of `target` (an index into the
    targets). Duplicates are harmless."""

    target: torch.Tensor
    item: torch.Tensor
    num_items: int

    @classmethod
    def from_lists(cls, lists, num_items: int) -> ItemPairs:
        """Pairs from one list of item indices per target (numpy arrays or lists); indices
        outside 0..num_items-1 are dropped."""
        arrays = [np.asarray(items, dtype=np.int64) for items in lists]
        arrays = [a[(a >= 0) & (a < num_items)] for a in arrays]
        target = np.repeat(np.arange(len(arrays)), [len(a) for a in arrays])
        items = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        return cls(torch.from_numpy(target), torch.from_numpy(items), num_items)

    def __len__(self) -> int:
        return len(self.target)

    def union(self, other: ItemPairs) -> ItemPairs:
        return ItemPairs(torch.cat([self.target, other.target]),
                         torch.cat([self.item, other.item]), self.num_items)

    def without(self, target_items: torch.Tensor) -> ItemPairs:
        """The pairs whose item is not the target's own item (a target is never its own
        non-negative, even when it repeats an item the client had)."""
        keep = self.item != target_items[self.target]
        return ItemPairs(self.target[keep], self.item[keep], self.num_items)

    def select(self, targets: torch.Tensor, num_targets: int) -> ItemPairs:
        """The pairs of `targets` (distinct target indices), renumbered 0..len(targets)-1 in
        their order; `num_targets` is how many targets the pairs index now."""
        new_index = torch.full((num_targets,), -1, dtype=torch.long, device=self.target.device)
        new_index[targets] = torch.arange(len(targets), device=targets.device)
        renumbered = new_index[self.target]
        keep = renumbered >= 0
        return ItemPairs(renumbered[keep], self.item[keep], self.num_items)

    def contains(self, targets: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Whether each (targets, items) pair (broadcast together) is one of these."""
        keys = self.target * self.num_items + self.item
        return torch.isin(targets * self.num_items + items, keys)

    def by_item(self) -> ItemPairs:
        """The same pairs sorted by item, for in_chunk."""
        order = torch.argsort(self.item, stable=True)
        return ItemPairs(self.target[order], self.item[order], self.num_items)

    def in_chunk(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(target, item - lo) of the pairs with lo <= item < hi; the pairs sorted by_item."""
        bounds = torch.searchsorted(self.item, torch.tensor([lo, hi], device=self.item.device))
        start, stop = int(bounds[0]), int(bounds[1])
        return self.target[start:stop], self.item[start:stop] - lo

    def dense(self, num_targets: int) -> torch.Tensor:
        """[num_targets, num_items] bool (for tests and small catalogs only)."""
        mask = torch.zeros(num_targets, self.num_items, dtype=torch.bool, device=self.item.device)
        mask[self.target, self.item] = True
        return mask


def seen_pairs(items: torch.Tensor, target_row: torch.Tensor, target_pos: torch.Tensor,
               num_items: int) -> ItemPairs:
    """The items at positions <= target_pos of each target's row: the client already had them
    when the state was formed. Only the past; padding (item 0) is left out, as every loss and
    ranking leaves item 0 out anyway."""
    history = items[target_row]  # [targets, window]
    places = torch.arange(items.shape[1], device=items.device)
    keep = (places.unsqueeze(0) <= target_pos.unsqueeze(1)) & (history > 0)
    target = torch.arange(len(target_row), device=items.device).unsqueeze(1).expand_as(history)
    return ItemPairs(target[keep], history[keep], num_items)


def tied_pairs(target_row: torch.Tensor, target_pos: torch.Tensor, target_item: torch.Tensor,
               num_items: int) -> ItemPairs:
    """For each target, the items of every target predicted from the same state (same row and
    position), its own included: under the strict tie rule the events of a group tied in time
    are all targets of the state before the group."""
    _, group = torch.unique(torch.stack([target_row.long(), target_pos.long()]), dim=1,
                            return_inverse=True)
    order = torch.argsort(group, stable=True)
    sizes = torch.bincount(group)
    starts = torch.cumsum(sizes, 0) - sizes
    per_target = sizes[group]  # each target pairs with every member of its group
    target = torch.repeat_interleave(torch.arange(len(group), device=group.device), per_target)
    offset = torch.arange(int(per_target.sum()), device=group.device) - torch.repeat_interleave(
        torch.cumsum(per_target, 0) - per_target, per_target)
    members = order[torch.repeat_interleave(starts[group], per_target) + offset]
    return ItemPairs(target, target_item[members], num_items)


def minus_infinity(like: torch.Tensor) -> torch.Tensor:
    """-inf as a 0-d tensor of `like`'s dtype and device: the value index_put_ writes."""
    return torch.tensor(float("-inf"), dtype=like.dtype, device=like.device)


def softmax_cross_entropy(states: torch.Tensor, target: torch.Tensor, vectors: Vectors,
                          bias: torch.Tensor, excluded: ItemPairs | None,
                          chunk: int = ITEM_CHUNK, all_vectors: torch.Tensor | None = None
                          ) -> torch.Tensor:
    """Mean cross-entropy of each state's target against every item but padding and its
    `excluded` pairs (the target itself is never excluded): the full softmax, exactly.

    A catalog of at most `chunk` items is one chunk (all_vectors, if given, are its vectors),
    computed as the dense loss always was (the same operations, so the same numbers, bit for
    bit). For a larger one the items' vectors are looked up chunk by chunk (no intermediate
    larger than a chunk's), and the logits made in blocks of rows over every item
    (candidate_cross_entropy): memory O(items x dim), as the table itself, plus one block's
    logits. Each block's logits are made once; remaking every item chunk's in backward
    (activation checkpointing, as before) made them twice."""
    num_items = bias.shape[0]
    pairs = excluded.without(target) if excluded is not None else None
    if num_items <= chunk:
        table = all_vectors if all_vectors is not None else vectors(
            torch.arange(num_items, device=states.device))
        logits = states @ table.T + bias
        logits[:, 0] = float("-inf")  # never a candidate: padding
        if pairs is not None and len(pairs):  # in place: no copy of the logits
            logits.index_put_((pairs.target, pairs.item), minus_infinity(logits))
        return F.cross_entropy(logits, target)
    table = torch.cat([vectors(torch.arange(lo, min(lo + chunk, num_items), device=states.device))
                       for lo in range(0, num_items, chunk)])
    shift = torch.cat([torch.full_like(bias[:1], float("-inf")), bias[1:]])  # padding: never
    rows, items = (pairs.target, pairs.item) if pairs is not None else (None, None)
    return candidate_cross_entropy(states, table, shift, target, rows, items)


class TargetFrequency:
    """A running count of how often each item was a training target (streaming frequency
    estimation, as Yi et al. 2019): the in-batch negatives' sampling probability. It lives
    beside the model, not in it: nothing is saved, and a resumed run counts again from zero."""

    def __init__(self, num_items: int):
        self.num_items = num_items
        self.counts: torch.Tensor | None = None
        self.total = 0  # counts.sum(), kept so that a step reads no catalog-sized tensor

    def update(self, targets: torch.Tensor) -> TargetFrequency:
        """Count `targets`; returns itself, whose `probability` then includes them."""
        if self.counts is None or self.counts.device != targets.device:
            self.counts = torch.zeros(self.num_items, dtype=torch.float64, device=targets.device)
        self.counts.index_add_(0, targets, torch.ones_like(targets, dtype=torch.float64))
        self.total += len(targets)
        return self

    def probability(self, items: torch.Tensor) -> torch.Tensor:
        """`items`' estimated probabilities (add-one smoothed over the whole catalog)."""
        return (self.counts[items] + 1) / (self.total + self.num_items)


def uniform_probability(items: torch.Tensor, num_items: int) -> torch.Tensor:
    """`items`' chance under a uniform draw over 1..N-1 (item 0, padding, is never drawn)."""
    chance = torch.full(items.shape, 1 / (num_items - 1), dtype=torch.float64,
                        device=items.device)
    return chance.masked_fill_(items == 0, 0.0)


def log_inclusion(probability: torch.Tensor, draws: int, uniform: int,
                  num_items: int) -> torch.Tensor:
    """log P(item in the sample), item by item, for items of the given `probability`, where
    the sample is `draws` draws by that probability and `uniform` uniform draws:
    1 - (1 - p)^draws (1 - 1/(N-1))^uniform. The candidates are the sample's distinct items, so
    this, not the expected count, is what decides how often an item competes."""
    log_missed = draws * torch.log1p(-probability.double().clamp(max=1 - 1e-12))
    log_missed = log_missed + uniform * torch.log1p(torch.tensor(-1 / (num_items - 1),
                                                                 dtype=torch.float64))
    return torch.log(-torch.expm1(log_missed)).clamp(min=-80.0)


def shared_sampled_softmax(states: torch.Tensor, target: torch.Tensor, vectors: Vectors,
                           bias: torch.Tensor, excluded: ItemPairs | None, uniform: int,
                           probability: Callable[[torch.Tensor], torch.Tensor] | None,
                           generator=None, log_q: bool = True) -> torch.Tensor:
    """Mean sampled-softmax loss of each state's target against negatives shared by the batch:
    the batch's distinct targets (drawn, in effect, by the data's target frequency:
    `probability(items)`, e.g. TargetFrequency.probability; None: uniform) and `uniform` uniform
    draws over items 1..N-1.

    log_q: every logit, the target's too, is lowered by the log of the chance that its item is
    in that sample (log_inclusion), which removes the sample's lean towards popular items: at
    the optimum the scores are the full softmax's (up to a constant). A
    candidate equal to the row's target or among its `excluded` items is no negative."""
    num_items, num_targets = bias.shape[0], target.shape[0]
    drawn = torch.randint(1, num_items, (uniform,), device=target.device, generator=generator)
    candidates = torch.unique(torch.cat([target, drawn]))
    # The targets are candidates: one lookup of the candidates' vectors serves both, and each
    # row's target logit is its target's column (at 10^6 items, 2,950 targets, the loss's
    # forward and backward take 0.74x the time of a second lookup and a concatenated column).
    target_column = torch.searchsorted(candidates, target)
    shift = bias[candidates]
    if log_q:  # for the candidates alone: nothing catalog-sized per step
        chance = (probability(candidates) if probability is not None
                  else uniform_probability(candidates, num_items))
        shift = shift - log_inclusion(chance, num_targets, uniform, num_items).to(shift.dtype)
    rows = columns = None
    if excluded is not None and len(excluded):  # each pair's column, if its item is a candidate
        column = torch.searchsorted(candidates, excluded.item).clamp(max=len(candidates) - 1)
        hit = (candidates[column] == excluded.item) & (column != target_column[excluded.target])
        rows, columns = excluded.target[hit], column[hit]
    return candidate_cross_entropy(states, vectors(candidates), shift, target_column,
                                   rows, columns)


# Logits of one block of rows of candidate_cross_entropy: 4 MB of float32, which stays in cache
# while the block's softmax and gradient are made from it.
BLOCK_LOGITS = 2**20


def candidate_cross_entropy(states: torch.Tensor, vectors: torch.Tensor, shift: torch.Tensor,
                            target_column: torch.Tensor, excluded_row: torch.Tensor | None = None,
                            excluded_column: torch.Tensor | None = None,
                            rows_per_block: int | None = None) -> torch.Tensor:
    """F.cross_entropy(states @ vectors.T + shift, target_column), the (excluded_row,
    excluded_column) logits set to -inf first, without a [rows x candidates] tensor: the rows go
    in blocks, and each block's gradient is made in forward from its logits while they are in
    cache (a loss is a scalar, so backward only scales it). At 10^6 items (2,950 targets, about
    5,000 candidates, one thread) the logits, their log-softmax and its gradient were three
    59 MB tensors, and the shared loss took 313 ms where it now takes 230. In float32 under
    autocast, as F.cross_entropy is. No excluded pairs: None."""
    if excluded_row is None:
        excluded_row = excluded_column = target_column.new_zeros(0)
    rows_per_block = rows_per_block or max(16, BLOCK_LOGITS // max(len(vectors), 1))
    wanted = torch.is_grad_enabled() and any(t.requires_grad for t in (states, vectors, shift))
    with torch.autocast(states.device.type, enabled=False):  # float32 throughout
        return _CandidateCrossEntropy.apply(states.float(), vectors.float(), shift.float(),
                                            target_column, excluded_row, excluded_column,
                                            rows_per_block, wanted)


class _CandidateCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, states, vectors, shift, target_column, excluded_row, excluded_column,
                rows_per_block, wanted):
        num_rows = states.shape[0]
        order = torch.argsort(excluded_row, stable=True)  # by row: a block's pairs are a slice
        excluded_row, excluded_column = excluded_row[order], excluded_column[order]
        starts = torch.arange(0, num_rows + rows_per_block, rows_per_block,
                              device=states.device)
        bounds = torch.searchsorted(excluded_row, starts).tolist()
        grads = (torch.empty_like(states), torch.zeros_like(vectors),
                 torch.zeros_like(shift)) if wanted else None
        total = torch.zeros((), dtype=torch.float64, device=states.device)
        vectors_t = vectors.T.contiguous()  # MKL's product with a transposed view was slower
        for block, lo in enumerate(range(0, num_rows, rows_per_block)):
            hi = min(lo + rows_per_block, num_rows)
            pairs = slice(bounds[block], bounds[block + 1])
            block_grads = None if grads is None else (grads[0][lo:hi], *grads[1:])
            total += _block_loss(states[lo:hi], vectors, vectors_t, shift,
                                 target_column[lo:hi], excluded_row[pairs] - lo,
                                 excluded_column[pairs], num_rows, block_grads)
        ctx.save_for_backward(*(grads or ()))
        return (total / num_rows).to(states.dtype)

    @staticmethod
    def backward(ctx, grad_loss):
        scaled = [g * grad_loss for g in ctx.saved_tensors]
        return *scaled, None, None, None, None, None


def _block_loss(states, vectors, vectors_t, shift, target_column, excluded_row,
                excluded_column, num_rows, grads) -> torch.Tensor:
    """One block of rows: the sum of its rows' losses (float64) and, with `grads` (its rows of
    the states' gradient, the vectors' and the shift's), their gradient of the mean loss."""
    logits = torch.addmm(shift, states, vectors_t)
    if len(excluded_row):
        logits.index_put_((excluded_row, excluded_column), minus_infinity(logits))
    rows = torch.arange(len(states), device=states.device)
    target_logit = logits[rows, target_column]
    top = logits.amax(1, keepdim=True)  # the target's column is never -inf: top is finite
    softmax = logits.sub_(top).exp_()  # in place: the block's only [rows x candidates] tensor
    normalizer = softmax.sum(1)
    loss = (normalizer.log() + top.squeeze(1) - target_logit).sum(dtype=torch.float64)
    if grads is not None:  # d mean loss / d logits = (softmax - one-hot of the target) / rows
        grad_states, grad_vectors, grad_shift = grads
        softmax.mul_((1.0 / num_rows) / normalizer.unsqueeze(1))
        softmax[rows, target_column] -= 1.0 / num_rows
        torch.mm(softmax, vectors, out=grad_states)
        grad_vectors.addmm_(softmax.T, states)
        grad_shift += softmax.sum(0)
    return loss


def item_table(encoder, chunk: int = ITEM_CHUNK) -> torch.Tensor:
    """[num_items, dim]: every item's vector (encoder.item_vectors), built chunk by chunk so
    that no [items x tags x dim] intermediate exists; for scoring, without gradients."""
    num_items = encoder.item.num_embeddings
    with torch.no_grad():
        if num_items <= chunk:
            return encoder.item_vectors()
        device = encoder.item.weight.device
        table = torch.empty_like(encoder.item.weight)  # filled in place: no second table
        for lo in range(0, num_items, chunk):
            hi = min(lo + chunk, num_items)
            table[lo:hi] = encoder.item_vectors(torch.arange(lo, hi, device=device))
        return table


def chunked_topk(score_chunk: Callable[[int, int], torch.Tensor], num_rows: int,
                 num_items: int, k: int, excluded: ItemPairs | None = None,
                 chunk: int = ITEM_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's top-k (values, item indices) over items 1..N-1, its `excluded` pairs left out:
    score_chunk(lo, hi) gives [rows, hi - lo] scores, one chunk at a time, merged as they come.
    The same as a dense topk of the masked scores wherever scores are distinct."""
    pairs = excluded.by_item() if excluded is not None else None
    values = indices = None
    for lo in range(0, num_items, chunk):
        hi = min(lo + chunk, num_items)
        scores = score_chunk(lo, hi).float()
        if values is None:  # on the scores' device (a model's on a GPU)
            values = scores.new_full((num_rows, 0), float("-inf"))
            indices = torch.zeros((num_rows, 0), dtype=torch.long, device=scores.device)
        if pairs is not None:
            rows, cols = pairs.in_chunk(lo, hi)
            scores[rows.to(scores.device), cols.to(scores.device)] = float("-inf")
        if lo == 0:
            scores[:, 0] = float("-inf")
        ids = torch.arange(lo, hi, device=scores.device).expand(num_rows, -1)
        values, picked = torch.cat([values, scores], 1).topk(min(k, values.shape[1] + hi - lo),
                                                              dim=1, sorted=True)
        indices = torch.cat([indices, ids], 1).gather(1, picked)
    return values, indices
