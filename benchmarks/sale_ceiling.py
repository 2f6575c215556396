"""The best p(sale) AUC any model can reach on the synthetic set: the generator's own probability.

    python -m benchmarks.sale_ceiling     # the demo's and the benchmarks' synthetic set

The generator draws each event's type from whether the run is in the client's taste and whether
the item continues a series (spark_jobs.synthetic._event_types), and a rating's value from the
taste. The sale label (a purchase, or a rating >= 4) therefore has a known probability per event;
ranking by it is the Bayes-optimal score, so its AUC bounds what the sale head can reach. Printed
for all events and for each client's last event (the test targets of leave-last-out).
"""

from __future__ import annotations

import argparse
import json
import sys
from math import erf, sqrt

import numpy as np
import pandas as pd

from spark_jobs import synthetic

LABEL_MIN_RATING = 4


def events_with_causes(params: synthetic.SyntheticParams) -> pd.DataFrame:
    """The generator's events plus the two hidden causes of each event's type."""
    causes = []
    original = synthetic._event_types

    def recording(rng, in_taste, continues):
        causes.append((in_taste.copy(), continues.copy()))
        return original(rng, in_taste, continues)

    frames = []
    synthetic._event_types = recording
    try:
        parts = max(1, params.parts or -(-params.events // 250_000))
        for part in range(parts):
            causes.clear()
            events = synthetic.generate_events_part(params, part)
            events["in_taste"], events["continues"] = causes[0]
            frames.append(events)
    finally:
        synthetic._event_types = original
    return pd.concat(frames, ignore_index=True)


def sale_probability(in_taste: np.ndarray, continues: np.ndarray) -> np.ndarray:
    """P(purchase) + P(rating) * P(a rounded rating >= 4), as the generator draws them."""
    def rated_high(taste):
        mean = synthetic.RATING_MEAN + synthetic.RATING_IN_TASTE * taste
        return 0.5 * (1 + erf((mean - (LABEL_MIN_RATING - 0.5)) / sqrt(2)))
    high = np.where(in_taste, rated_high(1), rated_high(0))
    purchase = (synthetic.P_PURCHASE_BASE + synthetic.P_PURCHASE_IN_TASTE * in_taste
                + synthetic.P_PURCHASE_CONTINUES * continues)
    return purchase + synthetic.P_RATING * high


def auc(score: np.ndarray, label: np.ndarray) -> float:
    ranks = pd.Series(score).rank().to_numpy()
    positive = label == 1
    n1, n0 = positive.sum(), (~positive).sum()
    return float((ranks[positive].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", default="clients=1200,items=300,events=60000,seed=7",
                   help="the synthetic source's parameters")
    args = p.parse_args(argv)
    values = dict(kv.split("=") for kv in args.source.split(","))
    params = synthetic.SyntheticParams(**{k: int(v) for k, v in values.items()})
    events = events_with_causes(params)
    events["oracle"] = sale_probability(events.in_taste.to_numpy(), events.continues.to_numpy())
    sale = (events.event_type == "purchase") | (
        (events.event_type == "rating") & (events.value >= LABEL_MIN_RATING))
    events["label"] = sale.astype(int)
    last = events.sort_values(["client_id", "timestamp"], kind="stable").groupby(
        "client_id").tail(1)
    result = {name: {"oracle_auc": round(auc(df.oracle.to_numpy(), df.label.to_numpy()), 4),
                     "positive_rate": round(float(df.label.mean()), 4), "events": len(df)}
              for name, df in (("all_events", events), ("last_events", last))}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
