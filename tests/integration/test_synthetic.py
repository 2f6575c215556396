"""The synthetic source: deterministic by seed, exact size, and with structure worth learning.
The unit-tier part is in tests/unit/test_synthetic.py."""

from __future__ import annotations

import pandas as pd
import pytest

from spark_jobs import synthetic as syn
from spark_jobs.synthetic import SyntheticParams, generate_events_part

SMALL = "clients=400,items=300,events=12000,seed=7,parts=3"


@pytest.mark.spark
def test_spark_generation_matches_numpy_and_is_deterministic(spark):
    p = SyntheticParams.parse(SMALL)
    events, attrs, items = syn.synthetic_source(spark, p)
    first = events.toPandas().sort_values(["client_id", "timestamp", "item_id"], ignore_index=True)
    second = syn.synthetic_source(spark, p)[0].toPandas()
    second = second.sort_values(["client_id", "timestamp", "item_id"], ignore_index=True)
    pd.testing.assert_frame_equal(first, second)
    local = pd.concat([generate_events_part(p, i) for i in range(p.n_parts)])
    local = local.sort_values(["client_id", "timestamp", "item_id"], ignore_index=True)
    pd.testing.assert_frame_equal(first, local, check_dtype=False)
    assert first["client_id"].nunique() == p.clients
    assert items.count() == p.items and attrs.count() > p.clients
