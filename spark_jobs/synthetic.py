"""A synthetic events source with structure a sequence model can learn and popularity cannot.

- Items come in ordered "series" (like episodes or volumes): after item k of a series a client
  often takes item k+1 next, so the previous event predicts the next one.
- Series popularity follows a power law; every series belongs to one category.
- Each client has a taste (a category) that drifts: now and then it switches to another one.
- Each client has a static `region` and a `tier` that changes over time (as-of attributes).
- Sales (purchases, high ratings) depend on what the history can tell: items of the client's
  taste, and the next item of a series it is in, sell far more often than others.

Generation runs in Spark: partition p of spark.range(parts) builds its slice of clients with numpy
generators seeded by (seed, p, stream), so the output depends only on the parameters, never on the
number of executors, and nothing is built in the driver but the small item tables.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

T0 = 1_577_836_800  # 2020-01-01 UTC
SPAN = 2 * 365 * 86_400
KNOWN_FROM_START = None  # attribute rows with no timestamp hold from the client's first event
TIERS = np.array(["bronze", "silver", "gold"], dtype=object)
EVENT_TYPES = np.array(["view", "purchase", "rating"], dtype=object)
P_RATING = 0.2  # share of rating events; purchases depend on taste and series (_event_types)
# P(purchase) = BASE + IN_TASTE * in_taste + CONTINUES * continues, at most 1 - P_RATING: the label
# follows what a history shows (taste, the series it is in) closely enough to leave a model room
# above popularity. Its best possible AUC on the demo's set is 0.82 (benchmarks/sale_ceiling.py);
# with the earlier 0.08 / 0.32 / 0.25 it was 0.72, just 0.06 above popularity's.
P_PURCHASE_BASE, P_PURCHASE_IN_TASTE, P_PURCHASE_CONTINUES = 0.03, 0.42, 0.35
RATING_MEAN, RATING_IN_TASTE = 3.0, 1.0  # a rating is rounded N(MEAN + IN_TASTE * in_taste, 1)

EVENTS_SCHEMA = "client_id long, item_id long, timestamp long, event_type string, value double"
ATTRS_SCHEMA = "client_id string, timestamp long, name string, value string"


@dataclass(frozen=True)
class SyntheticParams:
    clients: int = 1000
    items: int = 500
    events: int = 20_000
    seed: int = 0
    categories: int = 20
    parts: int = 0  # generator partitions; 0 = about 250k events each
    p_continue: float = 0.65  # chance that a run goes on to the next item of its series
    p_drift: float = 0.05  # chance per run that a client's taste switches
    p_taste: float = 0.8  # chance that a fresh run starts in the client's taste category
    # 1: every item is in at least one event (its "discovery"), so the catalog has exactly
    # `items` items at any size; 0: only the items the popularity draws reach (the default:
    # about 120k distinct of items=300000 at 10^6 events).
    cover: int = 0
    # 1: every event is a purchase (a shop's order lines: no views, no ratings), drawn exactly
    # as before otherwise, so the sequences are the same with or without it.
    purchases_only: int = 0

    def __post_init__(self):
        if self.clients < 1 or self.items < 1:
            raise ValueError("synthetic source needs clients >= 1 and items >= 1")
        if self.events < self.clients:
            raise ValueError(
                f"synthetic events ({self.events}) must be >= clients ({self.clients})"
            )
        if self.categories < 1 or self.parts < 0:
            raise ValueError("synthetic source needs categories >= 1 and parts >= 0")
        for name in ("p_continue", "p_drift", "p_taste"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"synthetic {name} is a probability (0 to 1), got "
                                 f"{getattr(self, name)}")
        for name in ("cover", "purchases_only"):
            if getattr(self, name) not in (0, 1):
                raise ValueError(f"synthetic {name} is 0 or 1, got {getattr(self, name)}")
        if self.cover and self.events < 2 * self.items:
            raise ValueError(f"synthetic cover=1 needs events >= 2 x items ({2 * self.items}), "
                             f"got {self.events}: raise events or lower items")

    @property
    def n_parts(self) -> int:
        return self.parts or max(1, min(self.clients, -(-self.events // 250_000)))

    @classmethod
    def parse(cls, spec: str) -> SyntheticParams:
        """`clients=1000,items=500,events=20000,seed=0` (any subset, in any order)."""
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        values = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, _, text = part.partition("=")
            if key not in types:
                raise ValueError(f"unknown synthetic parameter {key!r} (known: {sorted(types)})")
            values[key] = _number(key, text, whole=types[key] != "float")
        return cls(**values)


def _number(key: str, text: str, whole: bool) -> int | float:
    """`text` as the parameter's number (`events=5e7` is a whole number), or a ValueError that
    names the parameter (before: `items=abc` said only "could not convert string to float")."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"synthetic parameter {key}={text!r} is not a number") from None
    if not whole:
        return value
    if not value.is_integer():
        raise ValueError(f"synthetic parameter {key}={text!r} must be a whole number")
    return int(value)


def item_catalog(params: SyntheticParams) -> pd.DataFrame:
    """One row per item (ids 1..items): series, position in series, category, popularity."""
    rng = np.random.default_rng([params.seed, 1_000_003])
    lengths = np.minimum(1 + rng.poisson(3, size=params.items), 10)
    ends = np.cumsum(lengths)
    lengths = lengths[: np.searchsorted(ends, params.items) + 1]
    lengths[-1] -= lengths.sum() - params.items
    n_series = len(lengths)
    series = np.repeat(np.arange(n_series), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    rank = rng.permutation(n_series)
    popularity = 1.0 / (rank + 1.0) ** 1.1
    category = rng.integers(params.categories, size=n_series)
    return pd.DataFrame(
        {
            "item_id": np.arange(1, params.items + 1, dtype=np.int64),
            "series": series,
            "position": np.arange(params.items) - starts[series],
            "series_len": lengths[series],
            "category": category[series],
            "series_weight": popularity[series],
        }
    )


def client_slice(params: SyntheticParams, part: int) -> tuple[int, int, int]:
    """(first client, end client, events) of generator partition `part`."""
    bounds = np.linspace(0, params.clients, params.n_parts + 1).astype(np.int64)
    c0, c1 = int(bounds[part]), int(bounds[part + 1])
    e0 = params.events * c0 // params.clients
    e1 = params.events * c1 // params.clients
    return c0, c1, int(e1 - e0)


def _clients(params: SyntheticParams, part: int):
    """Per-client lengths, start times and initial taste: shared by the events and attributes."""
    c0, c1, n_events = client_slice(params, part)
    n = c1 - c0
    rng = np.random.default_rng([params.seed, part, 0])
    weights = rng.lognormal(0.0, 1.0, size=n)
    lengths = 1 + rng.multinomial(n_events - n, weights / weights.sum())
    starts = T0 + rng.integers(0, int(SPAN * 0.6), size=n)
    return np.arange(c0, c1), lengths, starts, rng.integers(params.categories, size=n)


def _series_sampler(catalog: pd.DataFrame, n_categories: int):
    """Vectorised popularity sampling of series, globally or within a category."""
    first = catalog.groupby("series").first()
    weight = first["series_weight"].to_numpy()
    global_cdf = np.cumsum(weight) / weight.sum()
    order = np.lexsort((first.index.to_numpy(), first["category"].to_numpy()))
    cats = first["category"].to_numpy()[order]
    w = weight[order]
    # key = category + cumulative share within the category: one searchsorted serves all.
    cum = np.zeros(len(w))
    for c in np.unique(cats):
        m = cats == c
        cum[m] = np.cumsum(w[m]) / w[m].sum()
    keys = cats + cum - 1e-12

    def sample(rng, taste):
        global_pick = np.searchsorted(global_cdf, rng.random(len(taste)))
        has_cat = np.isin(taste, cats)
        in_cat = order[
            np.minimum(np.searchsorted(keys, taste + rng.random(len(taste))), len(w) - 1)
        ]
        return np.where(has_cat, in_cat, global_pick).clip(0, len(weight) - 1)

    return sample


def _event_types(rng, in_taste: np.ndarray, continues: np.ndarray) -> np.ndarray:
    """Event type indices (EVENT_TYPES) that depend on what a client's history can tell: a
    client buys (and rates highly) what is in its taste, and more so when the item continues a
    series it is in. So p(sale) is learnable from the history, not a coin flip."""
    p_purchase = P_PURCHASE_BASE + P_PURCHASE_IN_TASTE * in_taste + P_PURCHASE_CONTINUES * continues
    p_rating = np.full(len(in_taste), P_RATING)
    u = rng.random(len(in_taste))
    return np.where(u < p_purchase, 1, np.where(u < p_purchase + p_rating, 2, 0))


def generate_events_part(params: SyntheticParams, part: int, catalog=None) -> pd.DataFrame:
    """The events of one generator partition (pure numpy; deterministic by seed and part)."""
    catalog = item_catalog(params) if catalog is None else catalog
    clients, lengths, starts, taste0 = _clients(params, part)
    rng = np.random.default_rng([params.seed, part, 1])
    n_runs = int(lengths.sum())  # one run per needed event always covers the client
    run_client = np.repeat(np.arange(len(clients)), lengths)
    run_start = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    first_run = np.zeros(n_runs, bool)
    first_run[run_start] = True
    # Taste drifts: a switch draws a new category, kept until the next switch (forward fill).
    switch = first_run | (rng.random(n_runs) < params.p_drift)
    drawn = np.where(first_run, taste0[run_client], rng.integers(params.categories, size=n_runs))
    last_switch = np.maximum.accumulate(np.where(switch, np.arange(n_runs), 0))
    taste = drawn[last_switch]
    in_taste = rng.random(n_runs) < params.p_taste
    sample = _series_sampler(catalog, params.categories)
    series = sample(rng, np.where(in_taste, taste, -1))
    series_first = catalog.groupby("series")["item_id"].min().to_numpy()
    series_len = catalog.groupby("series")["item_id"].count().to_numpy()
    offset = np.where(
        rng.random(n_runs) < 0.7, 0, rng.integers(0, 1 << 30, n_runs) % series_len[series]
    )
    run_len = np.minimum(rng.geometric(1 - params.p_continue, n_runs), series_len[series] - offset)
    # Expand runs into events, then keep each client's first `length` events.
    ev_run = np.repeat(np.arange(n_runs), run_len)
    ev_client = run_client[ev_run]
    ev_in_run = np.arange(len(ev_run)) - np.repeat(np.cumsum(run_len) - run_len, run_len)
    client_first = np.searchsorted(ev_client, np.arange(len(clients)))  # ev_client is sorted
    keep = np.arange(len(ev_run)) - client_first[ev_client] < lengths[ev_client]
    ev_run, ev_client, ev_in_run = ev_run[keep], ev_client[keep], ev_in_run[keep]
    n = len(ev_run)
    # Gaps: days between runs, minutes to hours inside one; minute resolution makes real ties.
    gap = np.where(ev_in_run == 0, rng.exponential(3 * 86_400, n), rng.exponential(7_200, n))
    is_first = np.zeros(n, bool)
    is_first[np.searchsorted(ev_client, np.arange(len(clients)))] = True
    gap[is_first] = 0
    # squeeze very long clients into the period so that no timestamp lies in the future
    total = np.bincount(ev_client, weights=gap, minlength=len(clients))
    scale = np.minimum(1.0, (T0 + SPAN - starts) / np.maximum(total, 1.0))
    gap = (gap * scale[ev_client] // 60 * 60).astype(np.int64)
    cum = np.cumsum(gap)
    timestamp = starts[ev_client] + cum - cum[np.flatnonzero(is_first)][ev_client]
    etype = _event_types(rng, in_taste[ev_run], ev_in_run > 0)
    if params.purchases_only:
        etype[:] = 1
    mean = RATING_MEAN + RATING_IN_TASTE * in_taste[ev_run]
    rating = np.clip(np.rint(rng.normal(mean, 1.0)), 1, 5)
    value = np.select([etype == 1, etype == 2], [1.0, rating], 0.0)
    item_id = (series_first[series[ev_run]] + offset[ev_run] + ev_in_run).astype(np.int64)
    if params.cover:
        _cover_items(params, part, item_id, ev_in_run == 0)
    return pd.DataFrame(
        {
            "client_id": clients[ev_client].astype(np.int64),
            "item_id": item_id,
            "timestamp": timestamp.astype(np.int64),
            "event_type": EVENT_TYPES[etype],
            "value": value,
        }
    )


def _cover_items(params: SyntheticParams, part: int, item_id: np.ndarray,
                 run_start: np.ndarray) -> None:
    """cover=1: this partition's share of the catalog (items part+1, part+1+parts, ...) each
    replace one event's item, chosen among the first events of runs (so series runs stay
    whole) while there are enough of those: every item then appears somewhere."""
    mine = np.arange(part + 1, params.items + 1, params.n_parts, dtype=np.int64)
    rng = np.random.default_rng([params.seed, part, 3])
    starts = np.flatnonzero(run_start)
    pool = starts if len(starts) >= len(mine) else np.arange(len(item_id))
    if len(pool) < len(mine):
        raise ValueError(f"synthetic cover=1: partition {part} has {len(pool)} events for "
                         f"{len(mine)} items: raise events or lower items")
    item_id[rng.choice(pool, size=len(mine), replace=False)] = mine


def generate_attrs_part(params: SyntheticParams, part: int) -> pd.DataFrame:
    """Client attributes (long form): a static region and a tier that changes 0-2 times."""
    clients, lengths, starts, _ = _clients(params, part)
    rng = np.random.default_rng([params.seed, part, 2])
    n = len(clients)
    region = pd.DataFrame(
        {
            "client": clients,
            "timestamp": pd.NA,
            "name": "region",
            "value": np.char.add("r", rng.integers(10, size=n).astype(str)).astype(object),
        }
    )
    changes = rng.integers(0, 3, size=n) + 1  # the first tier row starts at the client's start
    owner = np.repeat(np.arange(n), changes)
    at = starts[owner] + rng.integers(0, SPAN // 2, size=len(owner))
    at[np.concatenate([[0], np.cumsum(changes)[:-1]])] = starts
    tier = pd.DataFrame(
        {
            "client": clients[owner],
            "timestamp": at,
            "name": "tier",
            "value": TIERS[rng.integers(3, size=len(owner))],
        }
    )
    out = pd.concat([region, tier], ignore_index=True)
    out["client_id"] = out.pop("client").astype(str)
    out["timestamp"] = out["timestamp"].astype("Int64")
    return out[["client_id", "timestamp", "name", "value"]]


def synthetic_source(spark, params: SyntheticParams):
    """(events, client attributes, item attributes) DataFrames of the synthetic source."""
    from pyspark.sql import functions as F  # here, so that the generator itself needs no Spark

    from spark_jobs.pandas_frames import object_strings

    catalog = item_catalog(params)
    parts = spark.range(0, params.n_parts, 1, params.n_parts)

    def events(batches):
        for batch in batches:
            for part in batch["id"]:
                yield object_strings(generate_events_part(params, int(part), catalog))

    def attrs(batches):
        for batch in batches:
            for part in batch["id"]:
                yield object_strings(generate_attrs_part(params, int(part)))

    item_attrs = pd.DataFrame(
        {
            "item_id": catalog["item_id"].astype(str),
            "category": "cat" + catalog["category"].astype(str),
            "genres": "cat"
            + catalog["category"].astype(str)
            + "|series"
            + catalog["series"].astype(str),
        }
    )
    return (
        parts.mapInPandas(events, EVENTS_SCHEMA),
        parts.mapInPandas(attrs, ATTRS_SCHEMA),
        spark.createDataFrame(object_strings(item_attrs))
        .withColumn("year", F.lit(None).cast("int")),  # no years
    )
