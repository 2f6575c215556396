"""Property-based tests of the event validator: no malformed row crashes it, every row counts.

The pure rules (spark_jobs/validate_rules.py) take thousands of generated rows; one generated
batch also goes through the real Spark path (validate.flag_invalid / accounting) and must come out
the same row for row, so the pure rules are the Spark job's rules, not a look-alike.
The unit-tier part is in tests/unit/test_validator_fuzz.py."""

from collections import Counter

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from spark_jobs import validate
from spark_jobs.validate_rules import account, parse_row
from tests.helpers.fuzz_events import MAX_TS, batches, event_types, ids, timestamps, values

pytestmark = pytest.mark.both_stacks


@pytest.mark.spark
@pytest.mark.slow
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=batches.filter(lambda b: len(b) >= 20))
def test_a_fuzzed_batch_through_the_real_spark_validator(spark, batch):
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField(name, T.StringType()) for name in validate.EVENT_COLUMNS])
    raw = spark.createDataFrame(batch, schema)
    flagged = validate.flag_invalid(raw, MAX_TS)
    counts = validate.accounting(validate.count_copies(flagged))
    assert counts["input_rows"] == len(batch)  # nothing lost, nothing crashed
    assert counts["used"] + sum(counts["rejected"].values()) == len(batch)
    pure = account(batch, max_timestamp=MAX_TS)
    assert counts["used"] == pure["used"] and counts["rejected"] == pure["rejected"]
    # Row for row: the same parsed event and the same reason from Spark and from the pure rules.
    # input_seq (each record's input position, the tie-break) has no pure counterpart
    spark_rows = Counter(tuple(_same_nan(v) for v in r)
                         for r in flagged.drop("input_seq").collect())
    pure_rows = Counter(tuple(_same_nan(v) for v in parse_row(*r, max_timestamp=MAX_TS))
                        for r in batch)
    assert spark_rows == pure_rows


def _same_nan(v):
    return "NaN" if isinstance(v, float) and v != v else v


# CSV text: what RFC 4180 quoting is about (separators, quotes, line breaks) among ordinary text.
csv_text = st.text(st.sampled_from(list('ab1 ,;"\'\n\r\té')), min_size=1, max_size=10)
csv_rows = st.tuples(st.one_of(ids, csv_text), st.one_of(ids, csv_text), timestamps,
                     st.one_of(event_types, csv_text), st.one_of(values, csv_text))
csv_batches = st.lists(csv_rows, min_size=1, max_size=40).flatmap(
    lambda base: st.lists(st.sampled_from(base), max_size=30).map(lambda extra: base + extra))


def write_rfc4180(path, batch) -> list[tuple]:
    """Write the records as RFC 4180 CSV, LF-ended (a field with , " CR or LF quoted, quotes
    doubled); return them as a reader must see them: an empty field is missing (None), as Spark
    reads an empty field. Not Python's csv.writer: with LF as its line ending it leaves a CR
    unquoted, and a record's last field ending in CR then ends that line with CRLF (a file
    mixing CRLF and LF, read as csv_files.line_options says: that CR is no data)."""
    def field(value) -> str:
        text = "" if value is None else str(value)
        return f'"{text.replace(QUOTE, 2 * QUOTE)}"' if set(text) & set(',"\r\n') else text

    with path.open("w", encoding="utf-8", newline="") as f:
        for row in [validate.EVENT_COLUMNS, *batch]:
            f.write(",".join(map(field, row)) + "\n")
    return [tuple(None if v in (None, "") else v for v in row) for row in batch]


QUOTE = '"'


@pytest.mark.spark
@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=csv_batches)
@example(batch=[(None,) * 5, (None, None, None, None, "\r")])  # a CR alone: quoted, it is data
def test_fuzzed_rfc4180_csv_records_are_read_exactly_and_each_counted_once(spark, batch,
                                                                          tmp_path_factory):
    """Generated records with separators, doubled quotes and line breaks inside quoted fields,
    through the job's own CSV reader and validator: one row per record (not per physical line),
    every field exactly as written, every record used or rejected with a reason."""
    from spark_jobs.sources import read_table

    path = tmp_path_factory.mktemp("csv") / "events.csv"
    records = write_rfc4180(path, batch)
    raw = read_table(spark, str(path))
    validate.check_columns(raw)
    read = [tuple(r) for r in raw.select(*validate.EVENT_COLUMNS).collect()]
    assert sorted(read, key=repr) == sorted(records, key=repr)  # no record split, none altered
    counts = validate.accounting(validate.count_copies(validate.flag_invalid(raw, MAX_TS)))
    assert counts["input_rows"] == len(batch)  # records, not lines
    assert counts["used"] + sum(counts["rejected"].values()) == len(batch)
    pure = account(records, max_timestamp=MAX_TS)
    assert counts["used"] == pure["used"] and counts["rejected"] == pure["rejected"]
