"""Validation with row accounting: every input row is used or rejected with exactly one reason.

The reasons, in the order they are checked (a row gets the first that applies):
null_client_id, null_item_id, bad_timestamp (null or unparseable), negative_timestamp,
future_timestamp (after config.max_timestamp), unknown_event_type, bad_value (not a number),
missing_value (a rating without a value), out_of_range_value (a rating outside rating_range, or a
value of another type that is negative, non-finite or above MAX_EVENT_VALUE, 1e15), duplicate (an
exact copy of a used row; one copy of each is used, at its first position in the input). The job
reports input = used + sum(rejected by reason).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from hvd_ctsm.data.schema import EVENT_TYPES, MAX_EVENT_VALUE

REASONS = (
    "null_client_id",
    "null_item_id",
    "bad_timestamp",
    "negative_timestamp",
    "future_timestamp",
    "unknown_event_type",
    "bad_value",
    "missing_value",
    "out_of_range_value",
    "duplicate",
)
EVENT_COLUMNS = ("client_id", "item_id", "timestamp", "event_type", "value")
_ID_TYPES = (T.StringType, T.IntegralType)
ALLOWED_TYPES = {
    "client_id": _ID_TYPES,
    "item_id": _ID_TYPES,
    "timestamp": (
        T.IntegralType,
        T.FractionalType,
        T.StringType,
        T.TimestampType,
        T.TimestampNTZType,
        T.DateType,
    ),
    "event_type": (T.StringType,),
    "value": (T.NumericType, T.StringType, T.NullType),
}
_NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"


class SchemaError(ValueError):
    """A required column is missing or has a type the job cannot read."""


class StrictValidationError(ValueError):
    """--strict was given and some rows would have been rejected."""


def check_columns(df: DataFrame, allowed: dict = ALLOWED_TYPES, what: str = "events") -> None:
    """Stop with an error naming the column when one is missing or of an unreadable type."""
    types = {f.name: f.dataType for f in df.schema.fields}
    for name, accepted in allowed.items():
        if name not in types:
            raise SchemaError(f"{what}: missing column {name!r} (has: {sorted(types)})")
        if not isinstance(types[name], accepted):
            names = ", ".join(t.__name__.replace("Type", "").lower() for t in accepted)
            raise SchemaError(
                f"{what}: column {name!r} has type {types[name].simpleString()}, expected {names}"
            )


def one_event_type(events: DataFrame, event_type: str | None) -> DataFrame:
    """The events with `event_type` (FeatureConfig.event_type) as every row's type, and an empty
    value where the source has no value column; unchanged when it is None. A missing column is
    named with the source's own columns (not the ones added here) and the fix."""
    check_id_columns(events.columns)
    has = sorted(events.columns)
    if event_type is None:
        if "event_type" not in events.columns:
            raise SchemaError(f"events: missing column 'event_type' (has: {has}): add it, or give "
                              "every row one type: --event-type purchase for a purchase log")
        if "value" not in events.columns:
            raise SchemaError(f"events: missing column 'value' (has: {has}): add it, empty "
                              "where an event has no rating or amount")
        return events
    if "event_type" in events.columns:
        raise SchemaError(f"events: --event-type {event_type} was given, but the source has its "
                          "own event_type column, whose types are used without --event-type")
    if "value" not in events.columns:
        if event_type == "rating":
            raise SchemaError(f"events: --event-type rating needs a value column (has: {has})")
        events = events.withColumn("value", F.lit(None).cast("string"))
    return events.withColumn("event_type", F.lit(event_type))


def check_id_columns(columns: list[str]) -> None:
    """SchemaError naming a missing client_id, item_id or timestamp, the source's columns and the
    fix: other names, or a file separated by another character than the reader's."""
    has = sorted(columns) or "none: an empty file, or one without a header"
    for column in ("client_id", "item_id", "timestamp"):
        if column not in columns:
            one = columns[0] if len(columns) == 1 else ""
            other = next((sep for sep in ";|\t" if sep in one), None)  # Excel's ';' in Europe
            fix = (f"the file is separated by {other!r}: write it with ',' (a .csv) or tabs (a "
                   ".tsv)" if other else "name the source's columns client_id, item_id, "
                   "timestamp (in a CSV's header, or in a view read as table:NAME)")
            raise SchemaError(f"events: missing column {column!r} (has: {has}): {fix}")


def _id(col: Column) -> Column:
    text = F.trim(col.cast("string"))
    return F.when(text == "", None).otherwise(text)


def _timestamp(col: Column, dtype: T.DataType) -> Column:
    """Unix seconds (long) or null when unparseable; numeric strings are seconds, others ISO."""
    if isinstance(dtype, T.IntegralType):
        return col.cast("long")
    if isinstance(dtype, T.FractionalType):
        return F.when(~F.isnan(col) & (F.abs(col) < 1e17), F.floor(col).cast("long"))
    if isinstance(dtype, T.StringType):
        numeric = F.floor(col.cast("double")).cast("long")
        return F.when(col.rlike(_NUMBER), numeric).otherwise(F.to_timestamp(col).cast("long"))
    return F.to_timestamp(col).cast("long")  # timestamp or date


def _value(col: Column, dtype: T.DataType) -> tuple[Column, Column]:
    """(parsed double, True where the raw value is present but not a number)."""
    if isinstance(dtype, T.StringType):
        blank = col.isNull() | (F.trim(col) == "")
        special = F.lower(F.trim(col)).isin("nan", "inf", "-inf", "infinity", "-infinity")
        ok = blank | col.rlike(_NUMBER) | special
        return F.when(~blank & ok, F.trim(col).cast("double")), ~ok
    return col.cast("double"), F.lit(False)


def flag_invalid(raw: DataFrame, max_timestamp: int, rating_range=(0.0, 5.0)) -> DataFrame:
    """Parsed events plus `reject_reason` (null when valid); duplicates are not flagged here."""
    check_columns(raw)
    types = {f.name: f.dataType for f in raw.schema.fields}
    client, item = _id(F.col("client_id")), _id(F.col("item_id"))
    ts = _timestamp(F.col("timestamp"), types["timestamp"])
    etype = F.lower(F.trim(F.col("event_type")))
    value, bad_value = _value(F.col("value"), types["value"])
    is_rating = etype == "rating"
    finite = ~F.isnan(value) & (F.abs(value) != float("inf"))
    in_range = F.when(is_rating, value.between(*rating_range)).otherwise(
        finite & value.between(0, MAX_EVENT_VALUE))
    reason = (
        F.when(client.isNull(), "null_client_id")
        .when(item.isNull(), "null_item_id")
        .when(ts.isNull(), "bad_timestamp")
        .when(ts < 0, "negative_timestamp")
        .when(ts > F.lit(int(max_timestamp)), "future_timestamp")
        .when(etype.isNull() | ~etype.isin(*EVENT_TYPES), "unknown_event_type")
        .when(bad_value, "bad_value")
        .when(is_rating & value.isNull(), "missing_value")
        .when(value.isNotNull() & ~in_range, "out_of_range_value")
    )
    # The record's position in the input: the tie-break of same-timestamp events (split.py).
    seq = F.col("input_seq") if "input_seq" in raw.columns else F.monotonically_increasing_id()
    return raw.select(
        client.alias("client_id"),
        item.alias("item_id"),
        ts.alias("timestamp"),
        etype.alias("event_type"),
        F.coalesce(value, F.lit(0.0)).alias("value"),
        reason.alias("reject_reason"),
        seq.cast("long").alias("input_seq"),
    )


def count_copies(flagged: DataFrame) -> DataFrame:
    """One row per distinct (event, reason) with `copies` = how many input rows it stands for."""
    return flagged.groupBy(*EVENT_COLUMNS, "reject_reason").agg(
        F.count(F.lit(1)).alias("copies"), F.min("input_seq").alias("input_seq")
    )


def used_events(counted: DataFrame) -> DataFrame:
    """The valid rows, one per distinct event (the extra copies are the `duplicate` rejects)."""
    return counted.filter(F.col("reject_reason").isNull()).select(*EVENT_COLUMNS, "input_seq")


def accounting(counted: DataFrame) -> dict:
    """input, used, rejected {reason: n}, events_per_type; input == used + sum(rejected)."""
    rows = (
        counted.groupBy("reject_reason", "event_type")
        .agg(F.sum("copies").alias("rows"), F.count(F.lit(1)).alias("distinct"))
        .collect()
    )
    rejected = {reason: 0 for reason in REASONS}
    per_type = {name: 0 for name in EVENT_TYPES}
    used = 0
    for r in rows:
        if r["reject_reason"] is None:
            used += r["distinct"]
            per_type[r["event_type"]] += r["distinct"]
            rejected["duplicate"] += r["rows"] - r["distinct"]
        else:
            rejected[r["reject_reason"]] += r["rows"]
    total = used + sum(rejected.values())
    return {"input_rows": total, "used": used, "rejected": rejected, "events_per_type": per_type}


def raise_if_strict(counts: dict) -> None:
    bad = {k: v for k, v in counts["rejected"].items() if v}
    if bad:
        detail = ", ".join(f"{k}={v}" for k, v in bad.items())
        raise StrictValidationError(
            f"--strict: {sum(bad.values())} of {counts['input_rows']} rows would be rejected "
            f"({detail})"
        )
