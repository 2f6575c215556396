"""The feature job's per-row validation rules as pure Python functions (no Spark, no JVM).

They say, for one raw event whose columns arrive as text (a CSV source) or None, which reason
rejects it, in the same order and with the same parsing as the Spark expressions in
spark_jobs/validate.py. That makes the rules testable by the thousand with generated rows
(tests/{unit,integration}/test_validator_fuzz.py), and the fuzz test runs a generated batch
through the real Spark path too and checks that both agree row for row, so neither can drift
from the other unseen.

Parsing as Spark 3.5 does it (non-ANSI): `trim` removes ASCII spaces only; a numeric timestamp
string is floored seconds, a non-finite or huge one clamps to the long range; `cast('double')`
accepts nan/inf/infinity in any case; NaN compares greater than every number. ISO timestamp text
is Spark's own parser (`to_timestamp`): the pure rules cover numeric and unparseable text only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from hvd_ctsm.data.schema import EVENT_TYPES, MAX_EVENT_VALUE

# The same pattern as validate._NUMBER; ASCII: Java's \d and \s are ASCII-only by default.
NUMBER = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$", re.ASCII)
SPECIAL = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "infinity": math.inf,
           "-infinity": -math.inf}
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
_JAVA_SPACE = " \t\n\x0b\f\r"


def parse_id(text: str | None) -> str | None:
    """validate._id: trimmed text, None when null or blank."""
    if text is None:
        return None
    text = text.strip(" ")
    return text or None


def _to_long(x: float) -> int:
    """Spark's non-ANSI double -> long cast (as Java's): NaN 0, clamped to the long range."""
    if math.isnan(x):
        return 0
    if math.isinf(x):
        return LONG_MAX if x > 0 else LONG_MIN
    return max(LONG_MIN, min(LONG_MAX, int(x)))


def _spark_double(text: str) -> float | None:
    """cast(string as double): surrounding whitespace ignored, special words any case."""
    word = text.strip(_JAVA_SPACE)
    if word.lower() in SPECIAL:
        return SPECIAL[word.lower()]
    try:
        return float(word) if NUMBER.match(word) else None
    except ValueError:
        return None


def parse_timestamp(text: str | None) -> int | None:
    """validate._timestamp for a text column: numeric text is seconds; other text is None here
    (Spark tries ISO formats on it; the fuzz test keeps such text out of the comparison)."""
    if text is None or not NUMBER.match(text):
        return None
    value = _spark_double(text)
    return None if value is None else _to_long(math.floor(value) if math.isfinite(value)
                                               else value)


def parse_value(text: str | None) -> tuple[float | None, bool]:
    """validate._value for a text column: (number or None, True when present but no number)."""
    if text is None or text.strip(" ") == "":
        return None, False
    if NUMBER.match(text) or text.strip(" ").lower() in SPECIAL:
        return _spark_double(text.strip(" ")), False
    return None, True


def _in_range(value: float, is_rating: bool, rating_range: tuple[float, float]) -> bool:
    if math.isnan(value):  # Spark orders NaN above every number
        return False
    if is_rating:
        return rating_range[0] <= value <= rating_range[1]
    return math.isfinite(value) and 0 <= value <= MAX_EVENT_VALUE


def parse_row(client_id, item_id, timestamp, event_type, value, max_timestamp: int,
              rating_range: tuple[float, float] = (0.0, 5.0)) -> tuple:
    """(client, item, ts, event_type, value or 0.0, reject reason or None), as flag_invalid."""
    client, item, ts = parse_id(client_id), parse_id(item_id), parse_timestamp(timestamp)
    etype = event_type.strip(" ").lower() if event_type is not None else None
    number, bad_value = parse_value(value)
    is_rating = etype == "rating"
    if client is None:
        reason = "null_client_id"
    elif item is None:
        reason = "null_item_id"
    elif ts is None:
        reason = "bad_timestamp"
    elif ts < 0:
        reason = "negative_timestamp"
    elif ts > max_timestamp:
        reason = "future_timestamp"
    elif etype not in EVENT_TYPES:
        reason = "unknown_event_type"
    elif bad_value:
        reason = "bad_value"
    elif is_rating and number is None:
        reason = "missing_value"
    elif number is not None and not _in_range(number, is_rating, rating_range):
        reason = "out_of_range_value"
    else:
        reason = None
    return client, item, ts, etype, 0.0 if number is None else number, reason


def account(rows: Iterable[tuple], max_timestamp: int,
            rating_range: tuple[float, float] = (0.0, 5.0)) -> dict:
    """validate.accounting for raw rows: input == used + sum(rejected); copies of a used row
    beyond the first are `duplicate`."""
    from spark_jobs.validate import REASONS

    rejected = {reason: 0 for reason in REASONS}
    used: set[tuple] = set()
    total = 0
    for row in rows:
        total += 1
        *event, reason = parse_row(*row, max_timestamp=max_timestamp, rating_range=rating_range)
        if reason is not None:
            rejected[reason] += 1
        elif tuple(event) in used:
            rejected["duplicate"] += 1
        else:
            used.add(tuple(event))
    return {"input_rows": total, "used": len(used), "rejected": rejected}
