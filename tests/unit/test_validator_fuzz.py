"""Property-based tests of the event validator: no malformed row crashes it, every row counts.

The pure rules (spark_jobs/validate_rules.py) take thousands of generated rows; one generated
batch also goes through the real Spark path (validate.flag_invalid / accounting) and must come out
the same row for row, so the pure rules are the Spark job's rules, not a look-alike.
This file holds the unit-tier part; the rest is in tests/integration/test_validator_fuzz.py."""

from hypothesis import given, settings

from spark_jobs import validate
from spark_jobs.validate_rules import account, parse_row
from tests.helpers.fuzz_events import MAX_TS, TYPES, batches, rows


@settings(max_examples=600, deadline=None)
@given(rows)
def test_no_row_crashes_the_rules_and_each_gets_one_outcome(row):
    *event, reason = parse_row(*row, max_timestamp=MAX_TS)
    assert reason is None or reason in validate.REASONS
    if reason is None:  # a used row is a clean event
        client, item, ts, etype, value = event
        assert client and item and 0 <= ts <= MAX_TS and etype in TYPES
        assert value == value  # not NaN


@settings(max_examples=150, deadline=None)
@given(batches)
def test_every_row_is_used_or_rejected_with_a_reason(batch):
    counts = account(batch, max_timestamp=MAX_TS)
    assert counts["input_rows"] == len(batch)
    assert counts["used"] + sum(counts["rejected"].values()) == len(batch)
    distinct_valid = {tuple(parse_row(*r, max_timestamp=MAX_TS)[:5]) for r in batch
                      if parse_row(*r, max_timestamp=MAX_TS)[5] is None}
    assert counts["used"] == len(distinct_valid)
