"""The synthetic source: deterministic by seed, exact size, and with structure worth learning.
This file holds the unit-tier part; the rest is in tests/integration/test_synthetic.py."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from spark_jobs import synthetic as syn
from spark_jobs.synthetic import SyntheticParams, generate_events_part

SMALL = "clients=400,items=300,events=12000,seed=7,parts=3"


def consecutive(df: pd.DataFrame):
    d = df.sort_values(["client_id", "timestamp"], kind="stable")
    same = d["client_id"].to_numpy()[1:] == d["client_id"].to_numpy()[:-1]
    items = d["item_id"].to_numpy()
    return items[:-1][same], items[1:][same]


def test_parse_and_validation():
    p = SyntheticParams.parse(SMALL)
    assert (p.clients, p.items, p.events, p.seed, p.n_parts) == (400, 300, 12000, 7, 3)
    assert SyntheticParams.parse("events=10000000,clients=100000").n_parts == 40
    with pytest.raises(ValueError):
        SyntheticParams.parse("users=3")
    with pytest.raises(ValueError):
        SyntheticParams.parse("clients=10,events=5")


@pytest.mark.parametrize("spec, said", [
    ("items=abc", "items='abc' is not a number"),
    ("clients=1.5", "clients='1.5' must be a whole number"),
    ("p_drift=1.5", "p_drift is a probability"),
    ("cover=2", "cover is 0 or 1"),
    ("categories=0", "categories >= 1"),
])
def test_a_bad_parameter_is_named_in_its_error(spec, said):
    """Before: `items=abc` said only "could not convert string to float: 'abc'", and
    `clients=1.5` ran as clients=1."""
    with pytest.raises(ValueError, match=re.escape(said)):
        SyntheticParams.parse(spec)


def test_whole_numbers_may_be_written_in_float_notation():
    assert SyntheticParams.parse("events=5e7,clients=1e6").events == 50_000_000


def test_deterministic_by_seed_and_exact_size():
    p = SyntheticParams.parse(SMALL)
    parts = [generate_events_part(p, i) for i in range(p.n_parts)]
    assert sum(len(x) for x in parts) == p.events
    again = generate_events_part(p, 1)
    pd.testing.assert_frame_equal(parts[1], again)
    other = generate_events_part(SyntheticParams.parse(SMALL.replace("seed=7", "seed=8")), 1)
    assert not parts[1]["item_id"].equals(other["item_id"])
    attrs = syn.generate_attrs_part(p, 0)
    pd.testing.assert_frame_equal(attrs, syn.generate_attrs_part(p, 0))
    assert set(attrs["name"]) == {"region", "tier"}
    tier = attrs[attrs["name"] == "tier"]
    assert tier.groupby("client_id").size().max() > 1  # tiers change over time


def test_planted_series_structure_beats_popularity():
    p = SyntheticParams.parse(SMALL)
    df = pd.concat([generate_events_part(p, i) for i in range(p.n_parts)])
    prev, nxt = consecutive(df)
    catalog = syn.item_catalog(p).set_index("item_id")
    series = catalog["series"]
    same_series = (
        series.loc[prev].to_numpy() == series.loc[np.minimum(prev + 1, p.items)].to_numpy()
    )
    # "next item of the series" is right far more often than the most popular item
    successor_hits = np.mean((nxt == prev + 1) & same_series)
    popular_hits = np.mean(nxt == df["item_id"].value_counts().index[0])
    assert successor_hits > 0.35 and successor_hits > 10 * popular_hits
    # popularity is skewed (power law): the top 10% of items take a large share of events
    counts = np.sort(df["item_id"].value_counts().to_numpy())[::-1]
    assert counts[: len(counts) // 10].sum() > 0.35 * counts.sum()
    assert np.all(np.diff(df.groupby("client_id")["timestamp"].apply(np.array).iloc[0]) >= 0)


def test_taste_drift_changes_categories():
    p = SyntheticParams.parse(SMALL)
    df = generate_events_part(p, 0)
    catalog = syn.item_catalog(p).set_index("item_id")
    df["category"] = catalog.loc[df["item_id"], "category"].to_numpy()
    size = df.groupby("client_id")["item_id"].transform("size")
    by_client = df[size >= 60].sort_values("timestamp").groupby("client_id")["category"]
    early = by_client.apply(lambda c: c.iloc[: len(c) // 3].mode().iloc[0])
    late = by_client.apply(lambda c: c.iloc[-(len(c) // 3) :].mode().iloc[0])
    assert len(early) >= 10
    assert (early != late).mean() > 0.2  # tastes move for a good share of clients


def test_the_sale_label_follows_causes_a_history_can_show():
    """The generator's own sale probability ranks sales well (the bound a model can reach) and
    its mean matches the drawn labels: the label is learnable, not a coin flip."""
    from benchmarks.sale_ceiling import auc, events_with_causes, sale_probability

    events = events_with_causes(SyntheticParams(clients=300, items=100, events=12000, seed=3))
    probability = sale_probability(events.in_taste.to_numpy(), events.continues.to_numpy())
    label = ((events.event_type == "purchase")
             | ((events.event_type == "rating") & (events.value >= 4))).to_numpy().astype(int)
    assert auc(probability, label) > 0.78  # 0.807 for these parameters
    assert abs(probability.mean() - label.mean()) < 0.02


def test_cover_puts_every_item_of_any_catalog_in_some_event():
    """Without cover the popularity draws leave the tail out; with it every item 1..items
    appears, at the same event count, still deterministic."""
    spec = "clients=300,items=4000,events=9000,seed=3,parts=2"
    plain = pd.concat(generate_events_part(SyntheticParams.parse(spec), i) for i in range(2))
    covered_params = SyntheticParams.parse(spec + ",cover=1")
    covered = pd.concat(generate_events_part(covered_params, i) for i in range(2))
    assert plain["item_id"].nunique() < 3000
    assert set(covered["item_id"]) == set(range(1, 4001)) and len(covered) == 9000
    pd.testing.assert_frame_equal(generate_events_part(covered_params, 1),
                                  generate_events_part(covered_params, 1))
    with pytest.raises(ValueError, match="cover=1 needs events"):
        SyntheticParams.parse("clients=10,items=4000,events=5000,cover=1")


def test_purchases_only_keeps_the_sequences_and_makes_every_event_a_purchase():
    spec = "clients=200,items=300,events=1800,seed=4"
    mixed = generate_events_part(SyntheticParams.parse(spec), 0)
    bought = generate_events_part(SyntheticParams.parse(spec + ",purchases_only=1"), 0)
    assert (mixed["event_type"] != "purchase").sum() > 100
    assert set(bought["event_type"]) == {"purchase"} and set(bought["value"]) == {1.0}
    columns = ["client_id", "item_id", "timestamp"]
    pd.testing.assert_frame_equal(mixed[columns], bought[columns])
