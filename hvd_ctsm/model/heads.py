"""The CTSM's prediction heads: each turns the encoder's client states into a loss.

Plain PyTorch, like the encoder (hvd_ctsm.model.ctsm). A head reads the item vectors through the
encoder it is given (the TemporalEncoder's item_vectors()) and imports only hvd_ctsm.model.catalog
(torch alone: what grows with the catalog, in chunks and index pairs), so the model may import
it. A new target is a new head class here and an entry in CTSM's heads, with
no change to the encoder.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hvd_ctsm.config.model_config import ModelConfig
from hvd_ctsm.model import catalog


class NextItemHead(nn.Module):
    """Scores items by a dot product with the shared item embeddings (plus a popularity bias).

    loss: 'full' softmax over all items (exact, in blocks of rows: hvd_ctsm.model.catalog);
    'shared', a sampled softmax over negatives shared by the batch (its targets plus
    `shared_negatives` uniform draws) with the log-Q correction, whose cost does not grow with
    the catalog; 'auto', 'full' up to EXACT_MAX_ITEMS items and 'shared' above (see
    resolve_loss); 'sampled' softmax over the target and `negatives` uniformly sampled items per
    target; 'bce' binary loss of the target against `negatives` sampled items.
    exclude_seen: items the client already had at or before the state's position are no
    negatives (see catalog.seen_pairs); the target itself always stays.
    exclude_tied: the other targets predicted from the same state (events tied in time, under
    the strict tie rule) are no negatives of each other (see catalog.tied_pairs).
    Both reach the loss as one set of (target, item) pairs, targets["not_negative"].
    uniform_bce_weight: with the 'full' loss, add this weight times the 'bce' loss against
    `negatives` uniformly drawn items (what the sampled evaluation ranks the target against).
    future_targets, future_decay: with the 'full' loss and future_targets k > 1, each state
    also predicts the client's 2nd..k-th next targets of its example, the j-th next weighted by
    future_decay^(j-1) (see future_pairs); the items the client gets before such a target are
    no negatives of it.
    """

    def __init__(self, encoder: nn.Module, cfg: ModelConfig):
        super().__init__()
        self.encoder = [encoder]  # a list: share the embedding without registering it twice
        # Without item_bias the vector stays zero (same state keys, so checkpoints load either way).
        self.bias = nn.Parameter(torch.zeros(encoder.item.num_embeddings),
                                 requires_grad=cfg.item_bias)
        self.loss_kind = resolve_loss(cfg.loss, self.bias.shape[0], cfg.future_targets,
                                      cfg.uniform_bce_weight)
        self.negatives, self.exclude_seen = cfg.negatives, cfg.exclude_seen
        self.uniform_bce_weight, self.exclude_tied = cfg.uniform_bce_weight, cfg.exclude_tied
        self.future_targets, self.future_decay = cfg.future_targets, cfg.future_decay
        self.shared_negatives = cfg.shared_negatives
        self.frequency = catalog.TargetFrequency(self.bias.shape[0])

    def score(self, states: torch.Tensor, item_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[B, d] states -> [B, C] scores for item_ids ([C] or [B, C]); all items when None."""
        if item_ids is None:
            scores = states @ self.encoder[0].item_vectors().T + self.bias
            scores[:, 0] = float("-inf")  # never recommend padding
            return scores
        emb = self.encoder[0].item_vectors(item_ids)
        if item_ids.dim() == 1:
            return states @ emb.T + self.bias[item_ids]
        return torch.einsum("bd,bcd->bc", states, emb) + self.bias[item_ids]

    def not_negative(self, batch: dict[str, torch.Tensor]) -> catalog.ItemPairs | None:
        """(target, item) pairs of `batch` whose item is no negative of the target
        (exclude_seen, exclude_tied), or None when neither is on."""
        num_items, rows, positions = self.bias.shape[0], batch["target_row"], batch["target_pos"]
        pairs = None
        if self.exclude_seen:
            pairs = catalog.seen_pairs(batch["item"], rows, positions, num_items)
        if self.exclude_tied:
            tied = catalog.tied_pairs(rows, positions, batch["target_item"], num_items)
            pairs = tied if pairs is None else pairs.union(tied)
        return pairs

    def _vectors(self, item_ids: torch.Tensor) -> torch.Tensor:
        return self.encoder[0].item_vectors(item_ids)

    def loss(self, states: torch.Tensor, targets: dict[str, torch.Tensor]) -> torch.Tensor:
        target = targets["item"]
        seen = targets.get("not_negative") if self.exclude_seen or self.exclude_tied else None
        if self.loss_kind == "full":
            loss = self._softmax(states, target, seen)
            if self.uniform_bce_weight:
                sampled = self._sampled(states, target, seen)
                loss = loss + self.uniform_bce_weight * self._bce(*sampled)
            for offset in range(1, self.future_targets):
                loss = loss + self.future_decay**offset * self._future_loss(
                    states, targets, seen, offset)
            return loss
        if self.loss_kind == "shared":
            probability = (self.frequency.update(target).probability if self.training
                           else None)
            return catalog.shared_sampled_softmax(states, target, self._vectors, self.bias, seen,
                                                  self.shared_negatives, probability)
        logits, collides = self._sampled(states, target, seen)
        if self.loss_kind == "sampled":
            logits = logits.masked_fill(collides, float("-inf"))
            return F.cross_entropy(logits, torch.zeros_like(target))
        return self._bce(logits, collides)

    def _softmax(self, states, target, excluded):
        """The exact softmax loss over every item (catalog.softmax_cross_entropy)."""
        small = self.bias.shape[0] <= catalog.ITEM_CHUNK
        return catalog.softmax_cross_entropy(
            states, target, self._vectors, self.bias, excluded,
            all_vectors=self.encoder[0].item_vectors() if small else None)

    def _future_loss(self, states, targets, seen, offset):
        """Softmax loss of each state against the target `offset` places after its own (same
        example, a later state): the items the client gets from its own target up to that one
        are no negatives, nor (with seen) those it had."""
        src, dst = future_pairs(targets["row"], targets["pos"], offset)
        if not len(src):
            return states.new_zeros(())
        items, num_items = targets["item"], self.bias.shape[0]
        between = catalog.ItemPairs(
            torch.arange(len(src), device=src.device).repeat(offset),
            torch.cat([items[src + step] for step in range(offset)]), num_items)
        if seen is not None:
            between = between.union(seen.select(src, len(items)))
        return catalog.softmax_cross_entropy(states[src], items[dst], self._vectors, self.bias,
                                             between)

    def _sampled(self, states, target, excluded):
        """Scores of [target, `negatives` uniformly drawn items] per state, and which of those
        are no negatives: a draw that equals the target or, with exclude_seen or exclude_tied,
        one of the target's not_negative pairs (column 0, the target, never is)."""
        n_items = self.bias.shape[0]
        neg = torch.randint(1, n_items, (target.shape[0], self.negatives), device=target.device)
        candidates = torch.cat([target.unsqueeze(1), neg], dim=1)
        collides = candidates == target.unsqueeze(1)
        if excluded is not None and len(excluded):
            rows = torch.arange(target.shape[0], device=target.device).unsqueeze(1)
            collides |= excluded.contains(rows, candidates)
        collides[:, 0] = False
        return self.score(states, candidates), collides

    @staticmethod
    def _bce(logits, collides):
        """Binary loss: column 0 (the target) positive, the other columns negative, colliding
        draws left out."""
        labels = torch.zeros_like(logits)
        labels[:, 0] = 1.0
        return F.binary_cross_entropy_with_logits(logits, labels, weight=(~collides).float())


# The 'auto' next-item loss is the exact softmax up to this many items, the shared sampled one
# above. Every catalog whose quality this project has measured (80 to 24k items) keeps the exact
# loss; its time grows linearly with the items, the shared loss's stays about flat
# (benchmarks/scale.py: the loss alone for a 2,950-target batch, RESULTS.md "Catalog scale").
EXACT_MAX_ITEMS = 25_000


def resolve_loss(loss: str, num_items: int, future_targets: int = 1,
                 uniform_bce_weight: float = 0.0) -> str:
    """The loss 'auto' stands for at this catalog size: 'full' up to EXACT_MAX_ITEMS items (and
    whenever future_targets or uniform_bce_weight, which extend the full softmax, are set),
    'shared' above. Other losses are themselves."""
    if loss != "auto":
        return loss
    if num_items <= EXACT_MAX_ITEMS or future_targets > 1 or uniform_bce_weight:
        return "full"
    return "shared"


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



def future_pairs(target_row: torch.Tensor, target_pos: torch.Tensor, offset: int):
    """Indices (src, dst) of target pairs `offset` apart in an example's target list (targets of
    a row come in time order) whose later target is predicted from a strictly later state: the
    state of src then learns the item of dst, an event after its own next one. Under the strict
    tie rule, targets tied in time share a state and are not paired."""
    src = torch.arange(max(0, len(target_row) - offset), device=target_row.device)
    dst = src + offset
    keep = (target_row[dst] == target_row[src]) & (target_pos[dst] > target_pos[src])
    return src[keep], dst[keep]
