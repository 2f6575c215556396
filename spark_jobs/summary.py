"""What the feature job tells its user: the summary table, the warnings, and why a split has no
examples."""

from __future__ import annotations

import datetime as dt

from hvd_ctsm.data.schema import SERVING_SPLIT
from spark_jobs.config import TABLE_KINDS, FeatureConfig

# A share of held-out events at or above this whose earlier events all share their timestamp
# means coarse timestamps (dates without times, say), not a few bursts: ML-100K and the
# synthetic source have almost none.
TIED_SHARE_TO_WARN = 0.05
# A share of input rows at or above this rejected is more than a log's stray rows: a format the
# job reads otherwise (milliseconds, another date format), said in a warning. The built-in
# sources reject none.
REJECTED_SHARE_TO_WARN = 0.05
# An event before this (1980-01-01 UTC) is most likely a timestamp in another unit read as unix
# seconds: yyyymmdd numbers land in August 1970, hours or days since 1970 in its first weeks.
EARLIEST_PLAUSIBLE = 315_532_800
# A share of held-out targets at or above this that repeat an item their client had before is a
# log of repurchases (groceries, say), not a few: ML-100K has none (one rating a movie).
REPEAT_SHARE_TO_WARN = 0.05
# What a reason most often means when it takes many rows, and the fix.
REJECTION_HINTS = {
    "bad_timestamp": "the job reads unix seconds or ISO dates (2020-01-31, 2020-01-31 10:00:00); "
                     "convert other formats first",
    "future_timestamp": "after --max-timestamp (default now + 1 day): timestamps in milliseconds "
                        "or microseconds? the job reads unix seconds (divide them first)",
    "negative_timestamp": "before 1970: the job reads unix seconds",
    "unknown_event_type": "the job knows purchase, rating, view and profile: map other types "
                          "to these first (an order line is a purchase, a click a view)",
    "duplicate": "exact copies of a used row are used once (an order of two units as two equal "
                 "rows counts once)",
}


def summary_table(summary: dict) -> str:
    c = summary["counts"]  # labels padded to 32: '  rejected: unknown_event_type' is 30
    lines = [
        f"{'rows in':<32}{c['input_rows']:>12,}",
        f"{'used':<32}{c['used']:>12,}",
        *[f"{'  rejected: ' + k:<32}{v:>12,}" for k, v in c["rejected"].items() if v],
        f"{'rejected (total)':<32}{sum(c['rejected'].values()):>12,}",
        f"{'clients':<32}{c['clients']:>12,}",
        f"{'items':<32}{c['items']:>12,}",
        *[
            f"{'examples: ' + k:<32}{v['rows']:>12,}  targets {v['targets']:,}, "
            f"row groups {v['row_groups']}"
            for k, v in summary["splits"].items()
        ],
        *[f"{'  no history: ' + k:<32}{v:>12,}" for k, v in c["clients_without_history"].items()],
        *[f"{'    of which tied: ' + k:<32}{v:>12,}"
          for k, v in c["clients_with_tied_history_only"].items() if v],
        *[f"{'  repeat targets: ' + k:<32}{v:>12,}"
          for k, v in c["repeat_targets"].items() if v],
        f"{'seconds':<32}{summary['seconds']:>12.1f}",
    ]
    return "\n".join(lines)


def dataset_warnings(meta: dict, row_groups_requested: int) -> list[str]:
    """Lines for what the dataset holds that its user may not expect (the data was still used)."""
    few = {k: v["row_groups"] for k, v in meta["splits"].items()
           if v["row_groups"] < row_groups_requested}
    warnings = [f"{k}: only {n} row groups (< {row_groups_requested}): fewer rows than requested"
                for k, n in few.items()]
    tied = tied_timestamps_warning(meta)
    rejected = rejected_rows_warning(meta["counts"])
    early = early_events_warning(meta["counts"])
    repeats = repeat_targets_warning(meta)
    return warnings + [line for line in (rejected, early, tied, repeats) if line]


def repeat_targets_warning(meta: dict) -> str | None:
    """One line when many test targets of the user's own events are items their client had
    before: the evaluation ranks those last (the model recommends items a client has not had),
    a miss for every model. The built-in sources' shares are documented instead (the synthetic
    one's clients come back to their items: a line on every demo would be no news)."""
    if meta["source"].split(":", 1)[0] not in TABLE_KINDS:
        return None
    repeats = meta["counts"]["repeat_targets"]["test"]
    targets = meta["splits"]["test"]["targets"]
    if not targets or repeats < REPEAT_SHARE_TO_WARN * targets:
        return None
    return (f"{repeats:,} of {targets:,} test targets ({repeats / targets:.1%}) are items their "
            "client had before: the evaluation ranks them last and scoring recommends only items "
            "a client has not had, so they are misses for every model (HR@10 at most "
            f"{1 - repeats / targets:.1%} here)")


def early_events_warning(counts: dict) -> str | None:
    """One line when the earliest event used is before 1980: the rows were used, in 1970."""
    first = counts["first_event"]
    if first is None or first >= EARLIEST_PLAUSIBLE:
        return None
    return (f"the earliest event is at {day(first)} UTC: timestamps read as unix seconds that "
            "are in another unit (yyyymmdd numbers, hours or days since 1970) land in 1970; "
            "convert them to seconds or ISO dates")


def most_rejected(counts: dict) -> str:
    """'most as REASON (N)' and what that reason usually means, for a warning or an error."""
    reason, n = max(counts["rejected"].items(), key=lambda kv: kv[1])
    hint = REJECTION_HINTS.get(reason)
    return f"most as {reason} ({n:,})" + (f": {hint}" if hint else "")


def rejected_rows_warning(counts: dict) -> str | None:
    """One line when a large share of the input was rejected; each reason's count is in the
    summary table and metadata.json."""
    rejected = sum(counts["rejected"].values())
    if not counts["input_rows"] or rejected < REJECTED_SHARE_TO_WARN * counts["input_rows"]:
        return None
    return (f"{rejected:,} of {counts['input_rows']:,} input rows "
            f"({rejected / counts['input_rows']:.1%}) were rejected, {most_rejected(counts)}")


def tied_timestamps_warning(meta: dict) -> str | None:
    """Under --ties strict a held-out event whose client has no strictly earlier event is not
    scored, and events of one timestamp are not history for each other. With dates for
    timestamps that loses much of a purchase log without a word: say how much, and the choice."""
    if meta["ties"] != "strict":
        return None
    counts = meta["counts"]
    days = counts["whole_day_timestamps"]
    held_out = {name: n + meta["splits"][name]["rows"]
                for name, n in counts["clients_without_history"].items()}
    tied = {name: n for name, n in counts["clients_with_tied_history_only"].items() if n}
    if not days and all(n < TIED_SHARE_TO_WARN * held_out[name] for name, n in tied.items()):
        return None
    said = ["every timestamp is a whole day, so events of one day are not history for each "
            "other"] if days else []
    if tied:
        said.append("held-out events whose earlier events all share their timestamp are not "
                    "scored: " + ", ".join(f"{name} {n:,} of {held_out[name]:,} "
                                           f"({n / held_out[name]:.1%})"
                                           for name, n in tied.items()))
    return (f"--ties strict: {'; '.join(said)}; if the input's row order is the true order of "
            "tied events, --ties input-order uses it (spark_jobs/README.md, Splits)")


def day(seconds: int | None) -> str:
    """A unix time as the ISO date --cutoffs takes (UTC)."""
    if seconds is None:
        return "none"
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


# The fewest events of a client that give it a target in each split under leave-last-out.
LEAVE_LAST_OUT_EVENTS = {"train": 4, "validation": 3, "test": 2, SERVING_SPLIT: 1}


def no_examples_error(name: str, counts: dict, config: FeatureConfig) -> ValueError:
    """The error of a split without examples: the counts, the time span and the likely cause."""
    rejected = {k: v for k, v in counts["rejected"].items() if v}
    why = (f"{counts['used']} of {counts['input_rows']} input rows used, rejected by reason "
           f"{rejected}" if rejected else f"{counts['used']} input rows used")
    span = f"events from {day(counts['first_event'])} to {day(counts['last_event'])} UTC"
    if config.cutoffs:
        span += f", cutoffs {day(config.cutoffs[0])} and {day(config.cutoffs[1])}"
    fix = ("too little data, bad cutoffs, or timestamps in a format the job does not read "
           "(unix seconds or ISO)")
    if rejected and sum(rejected.values()) * 2 > counts["input_rows"]:  # the rows' own fault
        fix = f"the input's rows were rejected, {most_rejected(counts)}"
    elif config.split == "leave-last-out" and counts["clients"]:  # histories too short
        fix = (f"too few events a client ({counts['used'] / counts['clients']:.1f} here): a "
               "client's last event is its test target, the one before its validation target, "
               "and a target needs an earlier event (under --ties strict, at an earlier time), "
               f"so {name} targets need clients of {LEAVE_LAST_OUT_EVENTS[name]} or more "
               "events")
        if counts["whole_day_timestamps"] and config.ties == "strict":
            fix = ("every timestamp is a whole day, and under --ties strict a client's events of "
                   "one day are not history for each other, so a target needs an event on an "
                   "earlier day: --ties input-order takes the input's row order as their order")
    return ValueError(f"split {name!r} has no examples ({why}; {span}): {fix}")
