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

A head (hvd_ctsm.model.heads) turns the states at the target positions into a loss; a new target is
a
new head, with no change to the encoder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from hvd_ctsm.config.model_config import ModelConfig
from hvd_ctsm.model import catalog
from hvd_ctsm.model.heads import NextItemHead, SaleHead


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
    # Each item's tag indices (vocab.json's item_tags), read for model.item_tags only.
    item_tags: list[list[int]] = field(default_factory=list)


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


def position_bucket_of(max_len: int, buckets: int) -> torch.Tensor:
    """[max_len] the position table's row for each place in the window: the place itself
    (buckets=0), or one of `buckets` rows: the first buckets // 2 places keep a row each and
    the later ones share the other rows in log-spaced ranges (as T5's relative buckets), so
    the rarely filled late places pool what they learn. Each place's row depends on that place
    alone, so a state still reads nothing of the events after it."""
    places = torch.arange(max_len)
    if buckets <= 0 or buckets >= max_len:
        return places
    exact = max(1, buckets // 2)
    spread = (buckets - exact) / math.log(max_len / exact)
    shared = exact + (torch.log(places.clamp(min=exact) / exact) * spread).floor().long()
    return torch.where(places < exact, places, shared.clamp(max=buckets - 1))


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


def draw(table: nn.Embedding, std: float) -> None:
    """Draw a table's vectors from N(0, std^2), its padding row (if any) kept at zero."""
    nn.init.normal_(table.weight, std=std)
    if table.padding_idx is not None:
        with torch.no_grad():
            table.weight[table.padding_idx].zero_()


class TemporalEncoder(nn.Module):
    """Client state at every position from that position's event and all earlier ones."""

    def __init__(self, sizes: ModelSizes, cfg: ModelConfig):
        super().__init__()
        dim, heads, side_features = cfg.dim, cfg.heads, cfg.side_features
        if dim % heads:
            raise ValueError(f"model dim {dim} is not divisible by heads {heads}")
        if cfg.block not in MERGES:
            raise ValueError(f"unknown block {cfg.block!r}; known: {sorted(MERGES)}")
        self.item = nn.Embedding(sizes.num_items, dim, padding_idx=0)
        # A learned vector per place in the window, counted from its first event (as SASRec),
        # or with position_buckets one per bucket of places.
        self.position = None
        if cfg.learned_positions:
            places = position_bucket_of(sizes.max_len, cfg.position_buckets)
            self.register_buffer("place_to_row", places, persistent=False)
            self.position = nn.Embedding(int(places.max()) + 1, dim)
        self.category = None
        if cfg.item_category:  # an item's vector adds its category's, shared by its items
            known = sizes.item_category or [0] * sizes.num_items
            if len(known) != sizes.num_items:
                raise ValueError(f"{len(known)} item categories for {sizes.num_items} items")
            self.register_buffer("item_to_category", torch.tensor(known), persistent=False)
            self.category = nn.Embedding(max(known) + 1, dim, padding_idx=0)
            draw(self.category, dim**-0.5)
        self.tags = None
        if cfg.item_tags:  # an item's vector adds the mean of its tags' vectors
            self._init_tags(sizes, dim)
        self.side_features = side_features
        if side_features:
            self.event_type = nn.Embedding(sizes.num_event_types, dim, padding_idx=0)
            self.attrs = nn.ModuleList(
                nn.Embedding(n, dim, padding_idx=0) for n in sizes.attr_sizes)
            # Continuous features: the event's value and the log time gap to the previous event.
            self.numeric = nn.Sequential(nn.Linear(2, dim), nn.GELU(), nn.Linear(dim, dim))
        self.blocks = nn.ModuleList(
            CausalBlock(dim, heads, cfg.dropout, cfg.block, cfg.ff_mult, cfg.attention_dropout)
            for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(cfg.dropout)
        self.dim, self.heads, self.use_recency_bias = dim, heads, cfg.recency_bias
        # One slope per head, from 1 (mostly the last hours) halving head by head; learned.
        slopes = 0.5 ** torch.arange(heads).float()
        self.time_slopes = nn.Parameter(slopes) if cfg.time_bias else None
        draw(self.item, dim**-0.5)
        if cfg.feature_init_std is not None:  # None: PyTorch's default, 1 (the draws as before)
            # The tables added to each event's item vector; the item's own starts at 1.
            added = [self.position] if self.position is not None else []
            for table in added + ([self.event_type, *self.attrs] if side_features else []):
                draw(table, cfg.feature_init_std)

    def _init_tags(self, sizes: ModelSizes, dim: int) -> None:
        """item_to_tags: [num_items, most tags] tag indices padded with 0; tag_share: 1 / each
        item's number of tags (0 for none), so summing its tag vectors times it is their mean."""
        lists = sizes.item_tags or [[] for _ in range(sizes.num_items)]
        if len(lists) != sizes.num_items:
            raise ValueError(f"tags for {len(lists)} items, the model has {sizes.num_items}")
        width = max(1, max(map(len, lists)))
        padded = torch.tensor([t + [0] * (width - len(t)) for t in lists], dtype=torch.long)
        counts = torch.tensor([len(t) for t in lists], dtype=torch.float)
        self.register_buffer("item_to_tags", padded, persistent=False)
        self.register_buffer("tag_share", torch.where(counts > 0, 1 / counts.clamp(min=1), 0.0),
                             persistent=False)
        self.tags = nn.Embedding(int(padded.max()) + 1, dim, padding_idx=0)
        draw(self.tags, dim**-0.5)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        items = batch["item"]
        x = self.item_vectors(items) * math.sqrt(self.dim)
        if self.position is not None:
            x = x + self.position(self.place_to_row[:items.shape[1]])
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
        embedding, plus its category's with item_category and its tags' mean with item_tags.
        Input and output share them."""
        if self.category is None and self.tags is None:
            return self.item.weight if item_ids is None else self.item(item_ids)
        if item_ids is None:
            item_ids = torch.arange(self.item.num_embeddings, device=self.item.weight.device)
            vectors = self.item.weight
        else:
            vectors = self.item(item_ids)
        if self.category is not None:
            vectors = vectors + self.category(self.item_to_category[item_ids])
        if self.tags is not None:
            shares = self.tag_share[item_ids].unsqueeze(-1)
            vectors = vectors + self.tags(self.item_to_tags[item_ids]).sum(-2) * shares
        return vectors

    def use_sparse_gradients(self) -> list[nn.Parameter]:
        """Make the item and tag tables' gradients sparse (only the rows a batch looked up, each
        once): a model read only through item_vectors(item_ids) lookups, never the whole table,
        then has gradients whose size does not grow with the catalog. Returns those tables'
        parameters (an optimizer cannot take sparse gradients: densify them before its step)."""
        tables = [t for t in (self.item, self.tags) if t is not None]
        for table in tables:
            table.sparse = True
            table.rows_in_gradient = 0  # the last backward's, for the exchange's byte count

            def coalesce(grad, table=table):  # one entry per row, however often it was read
                grad = grad.coalesce()
                table.rows_in_gradient = grad._nnz()
                return grad

            table.weight.register_hook(coalesce)
        return [t.weight for t in tables]

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


# What the encoder reads from a batch: [rows, width, ...] tensors, cut per group in states_at.
ENCODER_INPUTS = ("item", "event_type", "value", "log_gap", "client_attrs")


def length_groups(items: torch.Tensor, target_row: torch.Tensor,
                  target_pos: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
    """The rows of a right-padded [rows, width] item tensor grouped by history length rounded
    up to a power of two: (row indices, the group's longest length) each, the shortest first.
    A row's length reaches its last non-padding item (an unknown item, 0, may sit inside a
    history) and its last target's position. A row is padded to less than twice it."""
    places = torch.arange(1, items.shape[1] + 1, device=items.device)
    lengths = ((items > 0) * places).amax(1)
    lengths = lengths.scatter_reduce(0, target_row, target_pos + 1, reduce="amax")
    bucket = torch.ceil(torch.log2(lengths.clamp(min=1).double())).long()
    groups = []
    for b in torch.unique(bucket).tolist():
        members = (bucket == b).nonzero().squeeze(1)
        groups.append((members, max(1, int(lengths[members].max()))))
    return groups


class CTSM(nn.Module):
    """Encoder plus heads. forward() returns {head name: loss} for a batch with targets."""

    def __init__(self, sizes: ModelSizes, cfg: ModelConfig):
        super().__init__()
        self.sizes, self.cfg = sizes, cfg
        self.encoder = TemporalEncoder(sizes, cfg)
        built = {"next_item": lambda: NextItemHead(self.encoder, cfg),
                 "sale": lambda: SaleHead(self.encoder, cfg.dim)}
        unknown = set(cfg.head_weights) - set(built)
        if unknown:
            raise ValueError(f"unknown heads {sorted(unknown)}; known: {sorted(built)}")
        self.heads = nn.ModuleDict({name: built[name]() for name in cfg.head_weights})

    @classmethod
    def from_checkpoint(cls, state: dict) -> CTSM:
        """The model saved in a model.pt state (checkpoint.load_state), in eval mode."""
        cfg = ModelConfig.from_saved(state["config"]["model"])
        model = cls(ModelSizes(**state["sizes"]), cfg)
        # assign: the saved tensors become the parameters, not a second copy of them beside
        # the state the caller keeps (256 MB of item table at 10^6 items)
        model.load_state_dict(state["model"], assign=True)
        return model.eval()

    def states_at(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The client state at each target's position: [num_targets, dim]. With
        cfg.length_groups the rows are encoded in groups of like length (length_groups)."""
        rows, positions = batch["target_row"], batch["target_pos"]
        groups = length_groups(batch["item"], rows, positions) if self.cfg.length_groups else []
        if len(groups) <= 1:
            return self.encoder(batch)[rows, positions]
        group_of = torch.full_like(batch["item"][:, 0], -1)  # -1: a group not reached yet
        place_in_group = torch.zeros_like(group_of)
        pieces, order = [], []
        for g, (members, width) in enumerate(groups):
            group_of[members] = g
            place_in_group[members] = torch.arange(len(members), device=members.device)
            part = {name: batch[name][members, :width] for name in ENCODER_INPUTS
                    if name in batch}
            mine = (group_of[rows] == g).nonzero().squeeze(1)
            states = self.encoder(part)
            pieces.append(states[place_in_group[rows[mine]], positions[mine]])
            order.append(mine)
        # Back into the targets' own order: the heads see exactly what one tensor gives.
        order = torch.cat(order)
        back = torch.empty_like(order)
        back[order] = torch.arange(len(order), device=order.device)
        return torch.cat(pieces)[back]

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        states = self.states_at(batch)
        targets = {"item": batch["target_item"], "label": batch["target_label"],
                   "log_dt": batch["target_log_dt"], "row": batch["target_row"],
                   "pos": batch["target_pos"]}
        not_negative = self.heads["next_item"].not_negative(batch)
        if not_negative is not None:
            targets["not_negative"] = not_negative
        return {name: head.loss(states, targets) for name, head in self.heads.items()}

    def score(self, states: torch.Tensor, item_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Next-item scores of (client state, item) pairs; all items when item_ids is None."""
        return self.heads["next_item"].score(states, item_ids)

    def p_sale(self, states, item_ids, log_dt=None) -> torch.Tensor:
        return torch.sigmoid(self.heads["sale"].logit(states, item_ids, log_dt))

    @torch.no_grad()
    def recommend(self, states: torch.Tensor, k: int, seen: list | None = None,
                  table: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores, item indices) of each state's top-k items, never padding nor an item in its
        row of `seen` (lists of item indices, one per state). Taken a chunk of items at a time,
        so memory grows with the states and k, not the catalog. table: catalog.item_table(
        self.encoder), built once by a caller that recommends for many batches."""
        num_items = self.sizes.num_items
        if table is None:
            table = catalog.item_table(self.encoder)
        excluded = catalog.ItemPairs.from_lists(seen, num_items) if seen is not None else None
        bias = self.heads["next_item"].bias
        return catalog.chunked_topk(lambda lo, hi: states @ table[lo:hi].T + bias[lo:hi],
                                    len(states), num_items, min(k, num_items), excluded)
