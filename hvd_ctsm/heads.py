"""The CTSM's prediction heads: each turns the encoder's client states into a loss.

Plain PyTorch, like the encoder (hvd_ctsm.model). A head reads the item vectors through the
encoder it is given (the TemporalEncoder's item_vectors()) and imports nothing of ours, so the
model may import it. A new target is a new head class here and an entry in CTSM's heads, with
no change to the encoder.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn


class NextItemHead(nn.Module):
    """Scores items by a dot product with the shared item embeddings (plus a popularity bias).

    loss: 'full' softmax over all items; 'sampled' softmax over the target and `negatives`
    uniformly sampled items; 'bce' binary loss of the target against `negatives` sampled items.
    exclude_seen: items the client already had at or before the state's position are no
    negatives (see seen_items); the target itself always stays.
    exclude_tied: the other targets predicted from the same state (events tied in time, under
    the strict tie rule) are no negatives of each other (see tied_targets).
    Both reach the loss as one mask, targets["not_negative"].
    uniform_bce_weight: with the 'full' loss, add this weight times the 'bce' loss against
    `negatives` uniformly drawn items (what the sampled evaluation ranks the target against).
    future_targets, future_decay: with the 'full' loss and future_targets k > 1, each state
    also predicts the client's 2nd..k-th next targets of its example, the j-th next weighted by
    future_decay^(j-1) (see future_pairs); the items the client gets before such a target are
    no negatives of it.
    """

    def __init__(self, encoder: nn.Module, loss: str, negatives: int, item_bias=True,
                 exclude_seen=False, uniform_bce_weight=0.0, exclude_tied=False,
                 future_targets=1, future_decay=0.5):
        super().__init__()
        self.encoder = [encoder]  # a list: share the embedding without registering it twice
        # Without item_bias the vector stays zero (same state keys, so checkpoints load either way).
        self.bias = nn.Parameter(torch.zeros(encoder.item.num_embeddings), requires_grad=item_bias)
        self.loss_kind, self.negatives, self.exclude_seen = loss, negatives, exclude_seen
        self.uniform_bce_weight, self.exclude_tied = uniform_bce_weight, exclude_tied
        self.future_targets, self.future_decay = future_targets, future_decay

    def score(self, states: torch.Tensor, item_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[B, d] states -> [B, C] scores for item_ids ([C] or [B, C]); all items when None."""
        table = self.encoder[0].item_vectors()
        if item_ids is None:
            scores = states @ table.T + self.bias
            scores[:, 0] = float("-inf")  # never recommend padding
            return scores
        emb = table[item_ids]
        if item_ids.dim() == 1:
            return states @ emb.T + self.bias[item_ids]
        return torch.einsum("bd,bcd->bc", states, emb) + self.bias[item_ids]

    def not_negative(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """[num_targets, num_items] bool: the items that are no negatives of each target of
        `batch` (exclude_seen, exclude_tied), or None when neither is on."""
        num_items, rows, positions = self.bias.shape[0], batch["target_row"], batch["target_pos"]
        masks = []
        if self.exclude_seen:
            masks.append(seen_items(batch["item"], rows, positions, num_items))
        if self.exclude_tied:
            masks.append(tied_targets(rows, positions, batch["target_item"], num_items))
        return functools.reduce(torch.logical_or, masks) if masks else None

    def loss(self, states: torch.Tensor, targets: dict[str, torch.Tensor]) -> torch.Tensor:
        target = targets["item"]
        seen = targets.get("not_negative") if self.exclude_seen or self.exclude_tied else None
        masked = seen
        if masked is not None:  # the target is never masked, even when it repeats a seen item
            masked = masked.scatter(1, target.unsqueeze(1), False)
        if self.loss_kind == "full":
            scores = self.score(states)
            logits = scores if masked is None else scores.masked_fill(masked, float("-inf"))
            loss = F.cross_entropy(logits, target)
            if self.uniform_bce_weight:
                sampled = self._sampled(states, target, masked)
                loss = loss + self.uniform_bce_weight * self._bce(*sampled)
            for offset in range(1, self.future_targets):
                loss = loss + self.future_decay**offset * self._future_loss(
                    scores, targets, seen, offset)
            return loss
        logits, collides = self._sampled(states, target, masked)
        if self.loss_kind == "sampled":
            logits = logits.masked_fill(collides, float("-inf"))
            return F.cross_entropy(logits, torch.zeros_like(target))
        return self._bce(logits, collides)

    @staticmethod
    def _future_loss(scores, targets, seen, offset):
        """Softmax loss of each state against the target `offset` places after its own (same
        example, a later state): the items the client gets from its own target up to that one
        are no negatives, nor (with seen) those it had."""
        src, dst = future_pairs(targets["row"], targets["pos"], offset)
        if not len(src):
            return scores.new_zeros(())
        items, logits = targets["item"], scores[src]
        rows = torch.arange(len(src), device=src.device)
        masked = torch.zeros_like(logits, dtype=torch.bool) if seen is None else seen[src]
        for step in range(offset):
            masked[rows, items[src + step]] = True
        masked[rows, items[dst]] = False
        return F.cross_entropy(logits.masked_fill(masked, float("-inf")), items[dst])

    def _sampled(self, states, target, masked):
        """Scores of [target, `negatives` uniformly drawn items] per state, and which of those
        are no negatives: a draw that equals the target or, with exclude_seen or exclude_tied,
        one in the not_negative mask (column 0, the target, never is)."""
        n_items = self.bias.shape[0]
        neg = torch.randint(1, n_items, (target.shape[0], self.negatives), device=target.device)
        candidates = torch.cat([target.unsqueeze(1), neg], dim=1)
        collides = candidates == target.unsqueeze(1)
        if masked is not None:
            collides |= masked.gather(1, candidates)
        collides[:, 0] = False
        return self.score(states, candidates), collides

    @staticmethod
    def _bce(logits, collides):
        """Binary loss: column 0 (the target) positive, the other columns negative, colliding
        draws left out."""
        labels = torch.zeros_like(logits)
        labels[:, 0] = 1.0
        return F.binary_cross_entropy_with_logits(logits, labels, weight=(~collides).float())


class SaleHead(nn.Module):
    """p(sale) for (client state, candidate item, time until the target): a small MLP."""

    def __init__(self, encoder: nn.Module, dim: int):
        super().__init__()
        self.encoder = [encoder]
        self.mlp = nn.Sequential(nn.Linear(3 * dim + 1, dim), nn.GELU(), nn.Linear(dim, 1))

    def logit(self, states, item_ids, log_dt=None) -> torch.Tensor:
        item = self.encoder[0].item_vectors(item_ids)
        if log_dt is None:
            log_dt = torch.zeros(item_ids.shape, device=states.device)
        features = torch.cat([states, item, states * item, log_dt.unsqueeze(-1)], dim=-1)
        return self.mlp(features).squeeze(-1)

    def loss(self, states: torch.Tensor, targets: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = self.logit(states, targets["item"], targets["log_dt"])
        return F.binary_cross_entropy_with_logits(logits, targets["label"])



def seen_items(items: torch.Tensor, target_row: torch.Tensor, target_pos: torch.Tensor,
               num_items: int) -> torch.Tensor:
    """[T, num_items] bool: item i is at a position <= target_pos of the target's row, i.e. the
    client already had it when the state was formed (padding, item 0, counts as seen). Only
    the past: an item first seen after target_pos is not marked."""
    b, t = items.shape
    positions = torch.arange(t, device=items.device).expand(b, t)
    first = torch.full((b, num_items), t, dtype=positions.dtype, device=items.device)
    first = first.scatter_reduce(1, items, positions, reduce="amin")
    return first[target_row] <= target_pos.unsqueeze(1)


def future_pairs(target_row: torch.Tensor, target_pos: torch.Tensor, offset: int):
    """Indices (src, dst) of target pairs `offset` apart in an example's target list (targets of
    a row come in time order) whose later target is predicted from a strictly later state: the
    state of src then learns the item of dst, an event after its own next one. Under the strict
    tie rule, targets tied in time share a state and are not paired."""
    src = torch.arange(max(0, len(target_row) - offset), device=target_row.device)
    dst = src + offset
    keep = (target_row[dst] == target_row[src]) & (target_pos[dst] > target_pos[src])
    return src[keep], dst[keep]


def tied_targets(target_row: torch.Tensor, target_pos: torch.Tensor, target_item: torch.Tensor,
                 num_items: int) -> torch.Tensor:
    """[T, num_items] bool: item i is the target of a target predicted from the same state
    (same row and position), the target's own item included. Under the strict tie rule every
    event of a group tied in time is predicted from the state before the group, so without
    this each one is a negative of the others."""
    states, group = torch.unique(torch.stack([target_row.long(), target_pos.long()]), dim=1,
                                 return_inverse=True)
    items = torch.zeros(states.shape[1], num_items, dtype=torch.bool, device=target_item.device)
    items[group, target_item] = True
    return items[group]
