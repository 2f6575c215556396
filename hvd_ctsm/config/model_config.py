"""The model section of the training config: what the encoder and its heads are.

Each field's docstring says what it does and why its default; the numbers behind each choice,
and what was tried and rejected, are in benchmarks/results/quality_history.md. The trainer's
other sections and the loading of presets and overrides are in hvd_ctsm.config, which holds
this one as TrainConfig.model; hvd_ctsm.model.ctsm builds the network from it, CTSM(sizes, cfg).
A saved model's section is read back with ModelConfig.from_saved (LEGACY_ARCH for the settings
it predates).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from hvd_ctsm.config.types import check, one_of


@dataclass
class ModelConfig:
    """The encoder and its heads. Each default was chosen on the validation splits of ML-100K
    (both tie rules) and the synthetic set (the record: see the module docstring)."""

    dim: int = 64
    """Width of embeddings and client states."""
    layers: int = 3
    """Causal attention blocks. 3 of 4 heads without attention dropout (since 2026-11-25; 2 of
    2 with it before) validated at or above 2 x 2 on every seed of every set, at about 1.27x
    the time per epoch."""
    heads: int = 4
    """Attention heads per block (must divide dim)."""
    dropout: float = 0.2
    """Dropout on embeddings, attention and feed-forward outputs."""
    attention_dropout: float | None = 0.0
    """Dropout on the attention weights (None: model.dropout, the default until 2026-11-25).
    At 0 PyTorch runs its fused attention kernel, which on one CPU thread takes about half the
    time of the unfused one that dropout needs."""
    block: str = "residual"
    """How each attention and feed-forward output joins the stream: 'residual' (x + y, as in
    SASRec and most transformers) or 'gated' (a GRU-style gate, GTrXL; 12 more dim x dim
    products per block)."""
    ff_mult: int = 4
    """Feed-forward width as a multiple of dim (SASRec: 1, most transformers: 4)."""
    side_features: bool = True
    """Feed the event type, value, time gap and client attributes besides the item and its
    position (False: items and positions only, as SASRec)."""
    recency_bias: bool = True
    """Bias each attention head towards recent events (ALiBi: a penalty growing linearly with
    the distance back, a different slope per head), besides the learned positions."""
    learned_positions: bool = True
    """Add a learned vector per place in the window (counted from its first event) to each
    event's input, as SASRec. With recency_bias the attention already knows how far back each
    event is, so false (no position table) is an option; it validated higher with input-order
    ties but lower under strict ties, the default protocol, so the table stays."""
    position_buckets: int = 0
    """With learned_positions: 0 gives each place in the window a vector of its own; N > 0
    keeps N vectors, one for each of the first N / 2 places and the rest shared by the later
    places in log-spaced ranges, so the late places, which few windows fill, pool theirs.
    0: 16 validated like no positions at all, higher with input-order ties and lower under
    strict ties."""
    feature_init_std: float | None = 0.1
    """Initial spread (standard deviation per component) of the vectors added to each event's
    item vector: its place in the window, its event type and the client's attributes. The
    item's own vector starts at 1 per component. None: PyTorch's default for these tables, also
    1 (the default until 2026-11-27, and the SASRec-style baseline's), so at the start the added
    vectors (one per place, event type and client attribute) outweigh the item's and training
    must first shrink what it cannot use; 0.1 starts them small, to grow where they help. 0.1
    validated higher on all three sets (medians of full and sampled NDCG@10 over three seeds)
    and peaks sooner; the sale head's validation AUC is lower (medians by 0.003-0.014).
    Initialisation only: a saved model is the same network either way, and --resume or a warm
    start may change it."""
    time_bias: bool = False
    """Also bias each attention head by the time between two events: a learned per-head
    penalty on log1p(hours) from the later event back to the earlier (time-interval-aware
    attention, as TiSASRec), so a burst of events reads as one session. Uses the history's
    time gaps only, so it stays causal. Off: with or without learned positions it validated
    level with the model without it."""
    item_category: bool = False
    """Add a learned vector per item category (the feature job's vocab.json item_category, e.g.
    MovieLens's first genre) to each item's vector, on input and in scoring. No effect where
    the data names no categories. Off: it raised validation sampled NDCG@10 with input-order
    ties but lowered it under strict ties and on the synthetic set (item_tags does more)."""
    item_tags: bool = True
    """Add the mean of learned tag vectors to each item's vector, on input and in scoring: the
    feature job's vocab.json item_tags, each item's genres and, where known, its release-year
    era, one of about ten eras of equal item counts (MovieLens: its genres and release date;
    the synthetic set: its category and series; an `events:` source: the item attributes'
    genres and year columns). Items sharing a tag share what is learned of it, which helps
    items with few events. No effect where the data names no tags; a dataset built before
    tags existed is refused in one line (rebuild it, or set this false). On since 2026-11-26:
    higher on ML-100K under both tie rules, level on the synthetic set, and it peaks sooner."""
    length_groups: bool = True
    """Encode a batch's rows in groups of like history length (lengths up to 1, 2, 4, 8, ...),
    each group padded only to its own longest, instead of every row to the batch's longest:
    the same states (padding follows every real event and the encoder is causal) and the same
    loss over the same batch, with less padding computed. With about 9 events a client, a
    random batch of 64 is padded to about 7x its events, grouped to about 1.2x. False: one
    tensor padded to the batch's longest row."""
    item_bias: bool = True
    """Learn a per-item score bias (popularity) besides the dot product with the client state."""
    exclude_seen: bool = True
    """Leave the items a client already had (in the example's window, up to the state's
    position) out of the next-item loss's negatives; a target that repeats one stays the
    target. Full-ranking evaluation and scoring never offer those items, so without this the
    loss spends effort pushing down scores that are never used."""
    exclude_tied: bool = False
    """Leave the other targets predicted from the same state out of each target's negatives.
    Under the strict tie rule every event of a group tied in time is a target of the state
    before the group (76% of ML-100K's training targets share their state), and each would
    otherwise be a negative of the others. No effect on data without such groups. Off: under
    strict ties it raised validation sampled NDCG@10 and lowered full NDCG@10 on every seed."""
    loss: str = "auto"
    """Next-item loss: 'full' softmax over every item (exact, in blocks of rows: its memory
    grows only as the item table does, its time with the catalog); 'shared', a sampled softmax
    over negatives shared by the batch (its targets and `shared_negatives` uniform draws) with
    the log-Q correction, whose time does not grow with the catalog; 'auto' (default),
    'full' up to 25,000 items (heads.EXACT_MAX_ITEMS) and 'shared' above, as the training log
    says; 'sampled' softmax or 'bce' with `negatives` sampled negatives per target. Up to
    2026-11-27 the default was 'full' at every size: 'auto' is the same loss on every catalog
    it could train (benchmarks/RESULTS.md, "Catalog scale")."""
    negatives: int = 100
    """Sampled negatives per target for the 'sampled' and 'bce' losses (and uniform_bce_weight)."""
    shared_negatives: int = 2048
    """Uniform draws shared by the whole batch for the 'shared' loss, besides the batch's own
    targets."""
    uniform_bce_weight: float = 0.0
    """With loss 'full': add this weight times a binary loss of each target against `negatives`
    uniformly drawn items, the kind of negatives the sampled evaluation ranks it against. 0:
    at weight 1 validation sampled NDCG@10 fell."""
    future_targets: int = 1
    """How many of the client's next events each state's next-item loss predicts: 1, the next
    one only (SASRec's objective); k > 1 also the 2nd..k-th next events of the same example,
    the j-th next weighted by future_decay^(j-1), with the events between them no negatives.
    Needs model.loss=full. Evaluation still ranks the next event only. 1: 2 and 3 lowered
    validation full NDCG@10."""
    future_decay: float = 0.5
    """Loss weight ratio from one future event to the next (with future_targets > 1)."""
    head_weights: dict[str, float] = field(default_factory=lambda: {"next_item": 1.0, "sale": 0.5})
    """Loss weight per head; the heads trained are the keys ('next_item', 'sale'). The sale
    head's 0.5 (0.3 from 2026-11-25, 0.1 before): its validation AUC rose or stayed level on
    all nine runs with ranking level; weight 1 cost ranking."""

    @classmethod
    def from_saved(cls, section: dict) -> ModelConfig:
        """The config a saved `model` section (a model.pt's, a run's config.yaml) describes: a
        setting the section predates is what such a model was built with (LEGACY_ARCH), not
        today's default; a setting since retired is left out."""
        known = {f.name for f in fields(cls)}
        return cls(**(LEGACY_ARCH | {k: v for k, v in section.items() if k in known}))

    def __post_init__(self):
        check(self.dim >= 1 and self.layers >= 1 and self.heads >= 1, "model sizes must be >= 1")
        check(self.dim % self.heads == 0, f"model.dim {self.dim} is not divisible by "
               f"model.heads {self.heads}: choose a multiple of it, or set model.heads")
        check(0.0 <= self.dropout < 1.0, f"model.dropout must be in [0, 1), got {self.dropout}")
        check(self.attention_dropout is None or 0.0 <= self.attention_dropout < 1.0,
               f"model.attention_dropout must be in [0, 1), got {self.attention_dropout}")
        one_of("model.loss", self.loss, {"auto", "full", "shared", "sampled", "bce"})
        one_of("model.block", self.block, {"residual", "gated"})
        check(self.ff_mult >= 1, f"model.ff_mult must be >= 1, got {self.ff_mult}")
        check(self.feature_init_std is None or self.feature_init_std > 0,
              f"model.feature_init_std must be > 0, got {self.feature_init_std}")
        check(self.position_buckets >= 0,
               f"model.position_buckets must be >= 0, got {self.position_buckets}")
        check(self.negatives >= 1, "model.negatives must be >= 1")
        check(self.shared_negatives >= 1, "model.shared_negatives must be >= 1")
        check(self.uniform_bce_weight >= 0, "model.uniform_bce_weight must be >= 0")
        check(self.uniform_bce_weight == 0 or self.loss in ("full", "auto"),
               "model.uniform_bce_weight needs model.loss=full (the others sample already)")
        check(self.future_targets >= 1,
               f"model.future_targets must be >= 1, got {self.future_targets}")
        check(self.future_targets == 1 or self.loss in ("full", "auto"),
               "model.future_targets > 1 needs model.loss=full")
        check(0.0 < self.future_decay <= 1.0,
               f"model.future_decay must be in (0, 1], got {self.future_decay}")
        check("next_item" in self.head_weights, "model.head_weights needs 'next_item'")
        for name, weight in self.head_weights.items():
            one_of("model.head_weights key", name, {"next_item", "sale"})
            check(weight >= 0, f"model.head_weights[{name}] must be >= 0")


# Architecture settings of models saved before they existed: such a model.pt is rebuilt as it was.
LEGACY_ARCH = {"block": "gated", "ff_mult": 4, "side_features": True, "item_bias": True,
               "exclude_seen": False, "recency_bias": False, "uniform_bce_weight": 0.0,
               "exclude_tied": False, "attention_dropout": None, "future_targets": 1,
               "future_decay": 0.5, "time_bias": False, "item_category": False,
               "item_tags": False, "learned_positions": True, "position_buckets": 0,
               "feature_init_std": None, "shared_negatives": 2048}

# What makes two saved models the same network (besides vocabulary sizes): a warm start copies
# weights only between equal architectures. Dropout, loss and loss weights may change.
ARCHITECTURE = ("dim", "layers", "heads", "block", "ff_mult", "side_features", "recency_bias",
                "item_bias", "time_bias", "item_category", "item_tags", "learned_positions",
                "position_buckets")

# Settings that only decide how a new model's weights are drawn: --resume may change them.
INIT_ONLY = ("feature_init_std",)


def architecture(model: dict) -> dict:
    """The architecture a config's `model` section describes (old sections read as LEGACY_ARCH),
    with the heads it trains under 'outputs'."""
    filled = LEGACY_ARCH | model
    return {k: filled[k] for k in ARCHITECTURE} | {"outputs": sorted(model["head_weights"])}
