"""The Client Time Series Model: a temporally-masked encoder and its prediction heads.

Plain PyTorch: nothing here knows about Horovod, Spark or Petastorm.

    events (item, position; with side features also type, value, time gap, client attributes)
    -> embeddings
    -> N x [causal self-attention -> merge, feed-forward -> merge]
    -> client state at every position (depends only on that position and earlier ones)
    -> heads: next item (over the shared item embeddings), p(sale) for (state, candidate item)

`merge` is a plain residual sum (block="residual") or a GRU-style gate (block="gated", GTrXL).
With recency_bias, attention also favours recent events (ALiBi: a per-head penalty that grows with
the distance back); with time_bias, also by the time elapsed (a learned per-head penalty on the
log hours between two events, as time-interval-aware attention does). With block="residual", no
side features, no recency or time bias, ff_mult=1 and the BCE loss with one negative, the encoder
is the SASRec model of Kang & McAuley (2018): the in-project baseline (preset `sasrec`).

A head turns the states at the target positions into a loss; a new target is a new head class in
HEADS, with no change to the encoder.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ModelSizes:
    """Sizes that come from the data (vocabularies), not from the user's config."""

    num_items: int  # including index 0, the padding
    num_event_types: int  # including padding
    attr_sizes: list[int] = field(default_factory=list)  # one vocabulary size per attribute
    max_len: int = 200
    # Each item's category index (vocab.json's item_category, 0 = unknown), read for
    # model.item_category only; empty: no category known.
    item_category: list[int] = field(default_factory=list)


class GRUGate(nn.Module):
    """GRU-style gated residual (as in GTrXL): out = (1 - z) * x + z * h(x, y).

    Replaces `x + y`. The gate bias starts positive so that each block starts close to the
    identity, which keeps deep stacks stable early in training. Position-wise: no time mixing.
    """

    def __init__(self, dim: int, gate_bias: float = 2.0):
        super().__init__()
        self.w_r, self.u_r = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.w_z, self.u_z = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim)
        self.w_g, self.u_g = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        nn.init.constant_(self.u_z.bias, -gate_bias)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        r = torch.sigmoid(self.w_r(y) + self.u_r(x))
        z = torch.sigmoid(self.w_z(y) + self.u_z(x))
        h = torch.tanh(self.w_g(y) + self.u_g(r * x))
        return (1 - z) * x + z * h


class Residual(nn.Module):
    """The plain residual merge: out = x + y (a transformer's, SASRec's)."""

    def __init__(self, dim: int):  # same signature as GRUGate; nothing to learn
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


MERGES = {"residual": Residual, "gated": GRUGate}


class CausalBlock(nn.Module):
    """Pre-norm causal self-attention and feed-forward, each merged into the stream by `block`
    ('residual' sum or 'gated' GRU-style gate)."""

    def __init__(self, dim: int, heads: int, dropout: float, block: str = "residual",
                 ff_mult: int = 4, attention_dropout: float | None = None):
        super().__init__()
        self.heads = heads
        self.norm_attn, self.norm_ff = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        hidden = ff_mult * dim
        self.ff = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        merge = MERGES[block]
        self.gate_attn, self.gate_ff = merge(dim), merge(dim)
        self.dropout = nn.Dropout(dropout)
        self.attn_dropout = dropout if attention_dropout is None else attention_dropout

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor | None = None) -> torch.Tensor:
        """attn_bias: None (plain causal attention) or a [heads, t, t] additive bias that is
        -inf above the diagonal (recency_bias), so causal either way."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm_attn(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        # Position i attends to positions <= i only. Histories are right-padded, so padding
        # always lies in a valid position's future and is never attended to.
        attn = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_bias, is_causal=attn_bias is None,
            dropout_p=self.attn_dropout if self.training else 0.0,
        )
        attn = attn.transpose(1, 2).reshape(b, t, d)
        x = self.gate_attn(x, self.dropout(self.proj(attn)))
        return self.gate_ff(x, self.dropout(self.ff(self.norm_ff(x))))


def recency_bias(heads: int, t: int, device=None) -> torch.Tensor:
    """[heads, t, t] causal attention bias that favours recent events (ALiBi, Press et al.
    2022): head h (1..heads) subtracts slope_h * (i - j) from query i's score for event j <= i,
    slope_h = 2^(-8h/heads), from a steep head that sees mostly the last events to a nearly flat
    one; future positions (j > i) get -inf."""
    slopes = 2.0 ** (-8.0 * torch.arange(1, heads + 1, device=device) / heads)
    pos = torch.arange(t, device=device)
    distance = (pos[:, None] - pos[None, :]).float().clamp(min=0)
    return -slopes[:, None, None] * distance + causal_mask(t, device)


def causal_mask(t: int, device=None) -> torch.Tensor:
    """[t, t] additive mask: 0 at and below the diagonal, -inf above it (the future)."""
    future = torch.ones(t, t, dtype=torch.bool, device=device).triu(1)
    return torch.zeros(t, t, device=device).masked_fill(future, float("-inf"))


def time_gap_bias(log_gap: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """[b, heads, t, t] attention bias -slope_h * log1p(hours between event j and event i) for
    j <= i, from each event's log1p(hours since the previous one) ([b, t], the history's
    log_gap). Query i's row reads only log_gaps at positions <= i: the clock at i and j is
    the sum of the gaps up to each, so it is causal with the causal mask it is added to."""
    clock = torch.expm1(log_gap.float()).clamp(min=0).cumsum(dim=1)  # hours since the first
    elapsed = (clock[:, :, None] - clock[:, None, :]).clamp(min=0)  # [b, i, j]
    return -slopes[None, :, None, None] * torch.log1p(elapsed)[:, None]


class TemporalEncoder(nn.Module):
    """Client state at every position from that position's event and all earlier ones."""

    def __init__(self, sizes: ModelSizes, dim: int, layers: int, heads: int, dropout: float,
                 block: str = "residual", ff_mult: int = 4, side_features: bool = True,
                 recency_bias: bool = False, attention_dropout: float | None = None,
                 time_bias: bool = False, item_category: bool = False):
        super().__init__()
        if dim % heads:
            raise ValueError(f"model dim {dim} is not divisible by heads {heads}")
        if block not in MERGES:
            raise ValueError(f"unknown block {block!r}; known: {sorted(MERGES)}")
        self.item = nn.Embedding(sizes.num_items, dim, padding_idx=0)
        self.position = nn.Embedding(sizes.max_len, dim)
        self.category = None
        if item_category:  # an item's vector adds its category's, shared by the category's items
            known = sizes.item_category or [0] * sizes.num_items
            if len(known) != sizes.num_items:
                raise ValueError(f"{len(known)} item categories for {sizes.num_items} items")
            self.register_buffer("item_to_category", torch.tensor(known), persistent=False)
            self.category = nn.Embedding(max(known) + 1, dim, padding_idx=0)
            nn.init.normal_(self.category.weight, std=dim**-0.5)
            with torch.no_grad():
                self.category.weight[0].zero_()
        self.side_features = side_features
        if side_features:
            self.event_type = nn.Embedding(sizes.num_event_types, dim, padding_idx=0)
            self.attrs = nn.ModuleList(
                nn.Embedding(n, dim, padding_idx=0) for n in sizes.attr_sizes)
            # Continuous features: the event's value and the log time gap to the previous event.
            self.numeric = nn.Sequential(nn.Linear(2, dim), nn.GELU(), nn.Linear(dim, dim))
        self.blocks = nn.ModuleList(
            CausalBlock(dim, heads, dropout, block, ff_mult, attention_dropout)
            for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)
        self.dim, self.heads, self.use_recency_bias = dim, heads, recency_bias
        # One slope per head, from 1 (mostly the last hours) halving head by head; learned.
        self.time_slopes = nn.Parameter(0.5 ** torch.arange(heads).float()) if time_bias else None
        nn.init.normal_(self.item.weight, std=dim**-0.5)
        with torch.no_grad():
            self.item.weight[0].zero_()

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        items = batch["item"]
        positions = torch.arange(items.shape[1], device=items.device)
        x = self.item_vectors(items) * math.sqrt(self.dim) + self.position(positions)
        if self.side_features:
            x = x + self.event_type(batch["event_type"])
            x = x + self.numeric(torch.stack([batch["value"], batch["log_gap"]], dim=-1))
            for i, table in enumerate(self.attrs):
                x = x + table(batch["client_attrs"][..., i])
        x = self.dropout(x) * (items > 0).unsqueeze(-1)
        bias = self.attention_bias(batch)
        for block in self.blocks:
            x = block(x, bias)
        return self.norm(x)

    def item_vectors(self, item_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The vectors of item_ids (any shape), or [num_items, dim] for all: the item's own
        embedding, plus its category's with item_category. Input and output share them."""
        if self.category is None:
            return self.item.weight if item_ids is None else self.item(item_ids)
        if item_ids is None:
            return self.item.weight + self.category(self.item_to_category)
        return self.item(item_ids) + self.category(self.item_to_category[item_ids])

    def attention_bias(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """The additive attention bias every block uses: None (plain causal attention), the
        recency bias [heads, t, t], or with time_bias a [b, heads, t, t] one; causal always."""
        t, device = batch["item"].shape[1], batch["item"].device
        if self.use_recency_bias:
            bias = recency_bias(self.heads, t, device)
        elif self.time_slopes is None:
            return None
        else:
            bias = causal_mask(t, device)
        if self.time_slopes is not None:
            bias = bias + time_gap_bias(batch["log_gap"], self.time_slopes)
        return bias


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

    def __init__(self, encoder: TemporalEncoder, loss: str, negatives: int, item_bias=True,
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

    def __init__(self, encoder: TemporalEncoder, dim: int):
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


HEADS = {"next_item": NextItemHead, "sale": SaleHead}


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


# Architecture settings of models saved before they existed: such a model.pt is rebuilt as it was.
LEGACY_ARCH = {"block": "gated", "ff_mult": 4, "side_features": True, "item_bias": True,
               "exclude_seen": False, "recency_bias": False, "uniform_bce_weight": 0.0,
               "exclude_tied": False, "attention_dropout": None, "future_targets": 1,
               "future_decay": 0.5, "time_bias": False, "item_category": False}


# What makes two saved models the same network (besides vocabulary sizes): a warm start copies
# weights only between equal architectures. Dropout, loss and loss weights may change.
ARCHITECTURE = ("dim", "layers", "heads", "block", "ff_mult", "side_features", "recency_bias",
                "item_bias", "time_bias", "item_category")


def architecture(model: dict) -> dict:
    """The architecture a config's `model` section describes (old sections read as LEGACY_ARCH),
    with the heads it trains under 'outputs'."""
    filled = LEGACY_ARCH | model
    return {k: filled[k] for k in ARCHITECTURE} | {"outputs": sorted(model["head_weights"])}


class CTSM(nn.Module):
    """Encoder plus heads. forward() returns {head name: loss} for a batch with targets."""

    def __init__(self, sizes: ModelSizes, dim=64, layers=3, heads=4, dropout=0.2,
                 loss="full", negatives=100, head_names=("next_item", "sale"),
                 block="residual", ff_mult=4, side_features=True, item_bias=True,
                 exclude_seen=True, recency_bias=True, uniform_bce_weight=0.0, exclude_tied=False,
                 attention_dropout=0.0, future_targets=1, future_decay=0.5, time_bias=False,
                 item_category=False):
        super().__init__()
        self.sizes = sizes
        self.encoder = TemporalEncoder(sizes, dim, layers, heads, dropout, block, ff_mult,
                                       side_features, recency_bias, attention_dropout, time_bias,
                                       item_category)
        built = {"next_item": lambda: NextItemHead(self.encoder, loss, negatives, item_bias,
                                                   exclude_seen, uniform_bce_weight, exclude_tied,
                                                   future_targets, future_decay),
                 "sale": lambda: SaleHead(self.encoder, dim)}
        unknown = set(head_names) - set(built)
        if unknown:
            raise ValueError(f"unknown heads {sorted(unknown)}; known: {sorted(built)}")
        self.heads = nn.ModuleDict({name: built[name]() for name in head_names})

    @classmethod
    def from_config(cls, sizes: ModelSizes, model: dict) -> CTSM:
        """The model a config's `model` section describes (a dict, e.g. asdict(cfg.model))."""
        arch = LEGACY_ARCH | {k: model[k] for k in LEGACY_ARCH if k in model}
        return cls(sizes, dim=model["dim"], layers=model["layers"], heads=model["heads"],
                   dropout=model["dropout"], loss=model["loss"], negatives=model["negatives"],
                   head_names=tuple(model["head_weights"]), **arch)

    @classmethod
    def from_checkpoint(cls, state: dict) -> CTSM:
        """The model saved in a model.pt state (checkpoint.load_state), in eval mode."""
        model = cls.from_config(ModelSizes(**state["sizes"]), state["config"]["model"])
        model.load_state_dict(state["model"])
        return model.eval()

    def states_at(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The client state at each target's position: [num_targets, dim]."""
        states = self.encoder(batch)
        return states[batch["target_row"], batch["target_pos"]]

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        states = self.states_at(batch)
        targets = {"item": batch["target_item"], "label": batch["target_label"],
                   "log_dt": batch["target_log_dt"], "row": batch["target_row"],
                   "pos": batch["target_pos"]}
        next_item = self.heads["next_item"]
        masks = []  # items that are no negatives of a target: see NextItemHead
        if next_item.exclude_seen:
            masks.append(seen_items(batch["item"], batch["target_row"], batch["target_pos"],
                                    self.sizes.num_items))
        if next_item.exclude_tied:
            masks.append(tied_targets(batch["target_row"], batch["target_pos"],
                                      batch["target_item"], self.sizes.num_items))
        if masks:
            targets["not_negative"] = functools.reduce(torch.logical_or, masks)
        return {name: head.loss(states, targets) for name, head in self.heads.items()}

    def score(self, states: torch.Tensor, item_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Next-item scores of (client state, item) pairs; all items when item_ids is None."""
        return self.heads["next_item"].score(states, item_ids)

    def p_sale(self, states, item_ids, log_dt=None) -> torch.Tensor:
        return torch.sigmoid(self.heads["sale"].logit(states, item_ids, log_dt))

    def recommend(self, states: torch.Tensor, k: int, exclude: torch.Tensor | None = None):
        """Top-k items per client state; `exclude` is a [B, num_items] bool mask."""
        scores = self.score(states)
        if exclude is not None:
            scores = scores.masked_fill(exclude, float("-inf"))
        return scores.topk(k, dim=-1)
