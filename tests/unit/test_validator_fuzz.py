"""Property-based tests of the event validator: no malformed row crashes it, every row counts.

The pure rules (spark_jobs/validate_rules.py) take thousands of generated rows; one generated
batch also goes through the real Spark path (validate.flag_invalid / accounting) and must come out
the same row for row, so the pure rules are the Spark job's rules, not a look-alike.
This file holds the unit-tier part; the rest is in tests/integration/test_validator_fuzz.py."""

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs import validate
from spark_jobs.validate_rules import account, parse_row

MAX_TS = 2_000_000_000
TYPES = ["purchase", "rating", "view", "profile"]
# Text that looks almost right is where validators break: padded, signed, exponent, special.
numeric_text = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.from_regex(r"\A[ \t]?[-+]?(\d{1,12}\.?\d{0,3}|\.\d{1,3})([eE][-+]?\d{1,3})?[ \t]?\Z"),
    st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "-INFINITY", "+inf", "1e400",
                     "-1e400", "0x10", "1_000", "", " ", "  7  ", "5.", ".5", "--1"]),
)
garbage_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
ids = st.one_of(st.none(), st.sampled_from(["", " ", "c1", " c1 ", "c2", "\tc3"]),
                garbage_text)
event_types = st.one_of(st.none(), st.sampled_from(TYPES),
                        st.sampled_from(TYPES).map(lambda t: f" {t.upper()} "),
                        st.text("abcdefghijklmnopqrstuvwxyz ", max_size=10))
# Timestamps: numeric text and text no date parser accepts (ISO text is Spark's own parser).
timestamps = st.one_of(st.none(), numeric_text, st.text("xyz!?_", min_size=1, max_size=6))
values = st.one_of(st.none(), numeric_text, garbage_text)
rows = st.tuples(ids, ids, timestamps, event_types, values)
# Many exact copies: duplicates are one of the reasons, and the hardest to count right.
batches = st.lists(rows, max_size=60).flatmap(
    lambda base: st.lists(st.sampled_from(base), max_size=80).map(lambda extra: base + extra)
    if base else st.just(base))


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
