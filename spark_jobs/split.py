"""Backtesting splits by time (never random): which events are targets of which split.

`assign_roles` adds `role`: "train", "validation", "test" or null (input only). Every event stays
in its client's sequence as input; the role only says what it is a target of.

- leave-last-out: a client's last event is the test target, the one before the validation target,
  all earlier events are training targets.
- time (T1, T2): events before T1 are training targets; the client's first event in [T1, T2) is
  its validation target and its first event at or after T2 its test target (one per client).

Events are ordered by EVENT_ORDER: time, then the record's position in the input (`input_seq`,
spark_jobs.sources). The same order is used when sequences are built, so "last" and "first" name
the same event everywhere even when timestamps tie. Ties are broken by input order, never by item
index: items are indexed by decreasing count, so an item-based tie-break would always make the
least popular item of a tied group the held-out target.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

EVENT_ORDER = ("timestamp", "input_seq")


def _order_key() -> Column:
    return F.struct(*[F.col(c) for c in EVENT_ORDER])


def leave_last_out(events: DataFrame) -> DataFrame:
    newest_first = Window.partitionBy("client_id").orderBy(*[F.col(c).desc() for c in EVENT_ORDER])
    rank = F.row_number().over(newest_first)
    role = F.when(rank == 1, "test").when(rank == 2, "validation").otherwise("train")
    return events.withColumn("role", role)


def time_split(events: DataFrame, t1: int, t2: int) -> DataFrame:
    client = Window.partitionBy("client_id")
    ts = F.col("timestamp")
    in_validation = (ts >= t1) & (ts < t2)
    in_test = ts >= t2
    key = _order_key()
    first_validation = F.min(F.when(in_validation, key)).over(client)
    first_test = F.min(F.when(in_test, key)).over(client)
    role = (
        F.when(ts < t1, "train")
        .when(in_validation & (key == first_validation), "validation")
        .when(in_test & (key == first_test), "test")
    )
    return events.withColumn("role", role)


def assign_roles(events: DataFrame, split: str, cutoffs=None) -> DataFrame:
    """events (client_id, timestamp, item, event_type, value, ...) plus `role`."""
    if split == "leave-last-out":
        return leave_last_out(events)
    if split == "time":
        t1, t2 = cutoffs
        return time_split(events, int(t1), int(t2))
    raise ValueError(f"unknown split {split!r}")
