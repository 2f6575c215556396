"""DataFrame -> DataFrame steps of the feature job on a real local Spark session."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from spark_jobs import attributes, split, validate

pytestmark = [pytest.mark.spark, pytest.mark.both_stacks]

RAW = "client_id string, item_id string, timestamp string, event_type string, value string"
NOW = 2_000_000_000
# (row, the reason it must be rejected for, or None when it is used)
PLANTED = [
    (("c1", "i1", "100", "rating", "4"), None),
    (("c1", "i1", "100", "rating", "4"), "duplicate"),
    (("c1", "i1", "100", "rating", "4"), "duplicate"),
    (("c1", "i2", "2020-01-01T10:00:00", "purchase", ""), None),
    (("c1", "i3", "2020-01-02", "View", None), None),
    ((None, "i1", "100", "rating", "4"), "null_client_id"),
    (("  ", "i1", "100", "rating", "4"), "null_client_id"),
    (("c2", None, "100", "rating", "4"), "null_item_id"),
    (("c2", "i1", "yesterday", "rating", "4"), "bad_timestamp"),
    (("c2", "i1", None, "rating", "4"), "bad_timestamp"),
    (("c2", "i1", "-5", "rating", "4"), "negative_timestamp"),
    (("c2", "i1", str(NOW + 1), "rating", "4"), "future_timestamp"),
    (("c2", "i1", "100", "click", "4"), "unknown_event_type"),
    (("c2", "i1", "100", None, "4"), "unknown_event_type"),
    (("c2", "i1", "100", "rating", "four"), "bad_value"),
    (("c2", "i1", "100", "rating", None), "missing_value"),
    (("c2", "i1", "100", "rating", "9"), "out_of_range_value"),
    (("c2", "i1", "100", "rating", "NaN"), "out_of_range_value"),
    (("c2", "i1", "100", "purchase", "-3"), "out_of_range_value"),
    (("c2", "i1", "100", "purchase", "1e16"), "out_of_range_value"),  # overflows the model
]


def test_planted_bad_rows_rejected_with_the_right_reason(spark):
    raw = spark.createDataFrame([row for row, _ in PLANTED], RAW)
    flagged = validate.flag_invalid(raw, NOW)
    reasons = [r["reject_reason"] for r in flagged.collect()]
    expected = [None if why == "duplicate" else why for _, why in PLANTED]
    assert reasons == expected  # input order is kept by a plain projection
    counts = validate.accounting(validate.count_copies(flagged))
    assert counts["input_rows"] == len(PLANTED)
    assert counts["used"] == sum(why is None for _, why in PLANTED)
    for reason in validate.REASONS:
        assert counts["rejected"][reason] == sum(why == reason for _, why in PLANTED), reason
    assert counts["input_rows"] == counts["used"] + sum(counts["rejected"].values())
    assert counts["events_per_type"] == {"purchase": 1, "rating": 1, "view": 1, "profile": 0}
    used = validate.used_events(validate.count_copies(flagged)).orderBy("item_id").collect()
    assert [r["timestamp"] for r in used] == [100, 1577872800, 1577923200]
    with pytest.raises(validate.StrictValidationError, match="duplicate=2"):
        validate.raise_if_strict(counts)


def test_missing_or_mistyped_column_names_the_column(spark):
    raw = spark.createDataFrame(
        [("c", "i", "1", "rating")],
        "client_id string, item_id string, timestamp string, event_type string",
    )
    with pytest.raises(validate.SchemaError, match="'value'"):
        validate.flag_invalid(raw, NOW)
    typed = spark.createDataFrame(
        [("c", "i", True, "rating", 1.0)],
        "client_id string, item_id string, timestamp boolean, event_type string, value double",
    )
    with pytest.raises(validate.SchemaError, match="'timestamp' has type boolean"):
        validate.flag_invalid(typed, NOW)


def test_asof_attributes_never_take_a_later_value(spark):
    events = spark.createDataFrame(
        [("a", t, 1) for t in (5, 10, 15, 20, 30)] + [("b", 10, 1)],
        "client_id string, timestamp long, item int",
    )
    updates = spark.createDataFrame(
        [
            ("a", None, "tier", 1),
            ("a", 10, "tier", 2),
            ("a", 20, "tier", 3),
            ("a", 25, "zone", 7),
            ("a", 31, "tier", 4),
            ("b", 11, "tier", 2),
        ],
        "client_id string, timestamp long, name string, idx int",
    ).withColumn("timestamp", F.coalesce("timestamp", F.lit(attributes.BEGINNING)))
    out = attributes.attach_attrs(events, updates, ["tier", "zone"])
    got = {(r["client_id"], r["timestamp"]): list(r["attrs"]) for r in out.collect()}
    assert got == {
        ("a", 5): [1, 0],
        ("a", 10): [2, 0],
        ("a", 15): [2, 0],
        ("a", 20): [3, 0],
        ("a", 30): [3, 7],
        ("b", 10): [0, 0],  # b's update at 11 is later than its event
    }


def _roles(spark, rows, how, cutoffs=None):
    """Roles of rows given in input order (input_seq = position in `rows`)."""
    events = spark.createDataFrame(
        [(*row, seq) for seq, row in enumerate(rows)],
        "client_id string, timestamp long, item int, event_type int, value double, input_seq long",
    )
    out = split.assign_roles(events, how, cutoffs).collect()
    return {(r["client_id"], r["timestamp"], r["item"]): r["role"] for r in out}


def test_leave_last_out_roles(spark):
    rows = [
        ("a", 1, 1, 2, 4.0),
        ("a", 2, 2, 2, 4.0),
        ("a", 3, 3, 2, 4.0),
        ("a", 3, 4, 2, 4.0),
        ("b", 9, 1, 2, 4.0),
    ]
    assert _roles(spark, rows, "leave-last-out") == {
        ("a", 1, 1): "train",
        ("a", 2, 2): "train",
        ("a", 3, 3): "validation",
        ("a", 3, 4): "test",
        ("b", 9, 1): "test",
    }


def test_tied_targets_follow_input_order_not_popularity(spark):
    """Items are indexed by decreasing count, so a tie-break on the item index would always hold
    out the least popular item of a tied group. The input order decides instead."""
    for last_in_input, first_in_input in ((4, 3), (3, 4)):
        rows = [("a", 1, 1, 2, 4.0), ("a", 3, first_in_input, 2, 4.0),
                ("a", 3, last_in_input, 2, 4.0)]
        roles = _roles(spark, rows, "leave-last-out")
        assert roles[("a", 3, last_in_input)] == "test"
        assert roles[("a", 3, first_in_input)] == "validation"


def test_time_split_first_event_of_each_window(spark):
    rows = [("a", t, t, 2, 4.0) for t in (1, 5, 10, 12, 20, 25)] + [("b", 15, 1, 2, 4.0)]
    assert _roles(spark, rows, "time", (10, 20)) == {
        ("a", 1, 1): "train",
        ("a", 5, 5): "train",
        ("a", 10, 10): "validation",
        ("a", 12, 12): None,
        ("a", 20, 20): "test",
        ("a", 25, 25): None,
        ("b", 15, 1): "validation",
    }


def test_each_split_file_holds_its_exact_slice_of_the_rows_in_order(spark):
    """File f gets rows [f * n / files, (f + 1) * n / files) of ROW_ORDER, sorted: with several
    rows a client, files that start inside a client, equal rows, and client ids whose UTF-8
    bytes and code points must order alike."""
    from spark_jobs import write

    clients = ["a", "b", "Z", "é", "日本", "z", "a b", "\u00ff"]
    rows = [(c, [t % 3, t], [t + 1]) for i, c in enumerate(clients) for t in range(1 + 3 * i)]
    rows += [rows[5], rows[5], ("z", [], [])]  # equal rows, empty histories
    df = spark.createDataFrame(
        rows, "client_id string, timestamp array<bigint>, target_time array<bigint>")
    ordered = sorted((c, list(t), list(g)) for c, t, g in rows)
    n = len(rows)
    for files in (1, 2, 7, 16, n):
        parts = write._placed(df, files, n).rdd.glom().collect()
        assert len(parts) == files
        for f, part in enumerate(parts):
            got = [(r["client_id"], list(r["timestamp"]), list(r["target_time"])) for r in part]
            assert got == ordered[-(-f * n // files):-(-(f + 1) * n // files)], (files, f)
