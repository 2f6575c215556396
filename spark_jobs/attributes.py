"""Client attributes as of each event: the latest attribute row at or before the event's time.

Attribute rows are long form (client_id, timestamp, name, value). A null timestamp means "known
from the start" (e.g. MovieLens u.user, which has no dates). A later value is never used: the
as-of lookup is a running `last(ignorenulls)` over the client's rows in time order, with attribute
rows sorted before events of the same second (an update stamped at t is known at t).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from spark_jobs.vocab import index_frame

BEGINNING = -(2**62)  # stands for "known from the start" in time ordering


def wide_to_long(df: DataFrame, names: list[str]) -> DataFrame:
    """client_id, timestamp, one column per attribute -> client_id, timestamp, name, value."""
    parts = [
        df.select(
            F.col("client_id").cast("string").alias("client_id"),
            F.col("timestamp").alias("timestamp"),
            F.lit(name).alias("name"),
            F.col(name).cast("string").alias("value"),
        )
        for name in names
    ]
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out.filter(F.col("value").isNotNull())


def index_attrs(client_attrs: DataFrame, attr_vocab: dict[str, list[str]]) -> DataFrame:
    """client_id, timestamp (BEGINNING for null), name, idx (vocabulary index of the value)."""
    spark = client_attrs.sparkSession
    frames = [
        index_frame(spark, values, "value", "idx").withColumn("name", F.lit(name))
        for name, values in attr_vocab.items()
    ]
    lookup = frames[0]
    for frame in frames[1:]:
        lookup = lookup.unionByName(frame)
    return client_attrs.join(F.broadcast(lookup), ["name", "value"]).select(
        "client_id",
        F.coalesce(F.col("timestamp").cast("long"), F.lit(BEGINNING)).alias("timestamp"),
        "name",
        "idx",
    )


def attach_attrs(events: DataFrame, attrs_indexed: DataFrame | None, names: list[str]) -> DataFrame:
    """events plus `attrs` (array<int>, one index per name, 0 = unknown) as of each event."""
    if not names or attrs_indexed is None:
        return events.withColumn("attrs", F.array().cast("array<int>"))
    cols = [f"_attr{i}" for i in range(len(names))]
    updates = attrs_indexed.groupBy("client_id", "timestamp").agg(
        *[
            F.max(F.when(F.col("name") == n, F.col("idx"))).alias(c)
            for n, c in zip(names, cols, strict=True)
        ]
    )
    event_cols = [c for c in events.columns if c not in ("client_id", "timestamp")]
    tagged = events.select(
        "client_id",
        "timestamp",
        *event_cols,
        F.lit(1).alias("_kind"),
        *[F.lit(None).cast("int").alias(c) for c in cols],
    )
    updates = updates.select(
        "client_id",
        "timestamp",
        *[F.lit(None).cast(events.schema[c].dataType).alias(c) for c in event_cols],
        F.lit(0).alias("_kind"),
        *cols,
    )
    running = (
        Window.partitionBy("client_id")
        .orderBy("timestamp", "_kind")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    asof = [F.coalesce(F.last(c, ignorenulls=True).over(running), F.lit(0)) for c in cols]
    both = tagged.unionByName(updates).withColumn("attrs", F.array(*asof).cast("array<int>"))
    return both.filter(F.col("_kind") == 1).select("client_id", "timestamp", *event_cols, "attrs")
