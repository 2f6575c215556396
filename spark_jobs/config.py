"""Typed configuration of the feature job (the CLI and notebooks build the same FeatureConfig)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import time
from dataclasses import dataclass, field

from hvd_ctsm.data.schema import EVENT_TYPES

SPLIT_KINDS = ("time", "leave-last-out")
TIE_RULES = ("strict", "input-order")
TABLE_KINDS = ("events", "table", "delta")  # sources of raw event rows (the canonical columns)
SOURCE_KINDS = ("movielens", "synthetic", *TABLE_KINDS)
SPLIT_HELP = ("leave-last-out (default): a client's last event is its test target, the one "
              "before its validation target; time: by --cutoffs")
CUTOFFS_HELP = ("T1,T2 (unix seconds or ISO dates) for --split time: training targets before "
                "T1, a client's first event in [T1, T2) its validation target, its first at or "
                "after T2 its test target")
EVENT_TYPE_HELP = ("for a source without an event_type column (a purchase log: client_id, "
                   "item_id, timestamp): every row's type; its value column may then be "
                   "absent (a rating needs one)")


def parse_time(text: str | int | float) -> int:
    """Unix seconds from an int, a numeric string or an ISO date/datetime (UTC when naive)."""
    if isinstance(text, int | float):
        return int(text)
    text = str(text).strip()
    try:
        return int(float(text))
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError as err:
        raise ValueError(f"not unix seconds nor an ISO date: {text!r}") from err
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp())


@dataclass
class FeatureConfig:
    """Everything the feature job needs; validated on construction."""

    source: str
    """Where events come from: `movielens:DIR`, `synthetic:clients=..,items=..,events=..,seed=..`,
    `events:PATH` (Parquet or CSV file/folder; a path or a URL Spark's Hadoop filesystems read,
    e.g. file://, hdfs://, s3a:// where the cluster has the hadoop-aws jars, dbfs:/),
    `table:NAME` (any table the session's catalog knows: spark.table) or `delta:PATH` (a Delta
    table folder; needs the Delta Lake jars in the session)."""
    out: str
    """Output folder (OUT/train, OUT/validation, OUT/test, OUT/serving, OUT/vocab.json,
    OUT/metadata.json): a path, or a URL (s3://, hdfs://, ...) the finished dataset is uploaded
    to; a URL must not exist yet."""
    split: str = "leave-last-out"
    """`leave-last-out` (last event per client = test, the one before = validation) or `time`."""
    cutoffs: tuple[int, int] | str | None = None
    """(T1, T2) for `split="time"`, unix seconds or ISO dates (or "T1,T2"): train targets < T1 <=
    validation < T2 <= test."""
    max_len: int = 200
    """Longest history of one example (L)."""
    ties: str = "strict"
    """Events of one client with the same timestamp: `strict` (default, leakage-safe): none of
    them is history for another, each is predicted from the state before the whole group.
    `input-order`: they count as ordered by their position in the input, so the first is history
    for the next (what most published results do, e.g. on MovieLens; it assumes the input order
    is the true order, which can leak when it is not). Either way the held-out targets of a tied
    group are chosen by input order, never by popularity."""
    row_groups: int = 64
    """Least number of Parquet row groups per split (Petastorm shards by row group)."""
    label_min_rating: float = 4.0
    """A rating event is a positive label when its value is at least this."""
    event_type: str | None = None
    """For an events:, table: or delta: source without an `event_type` column (a purchase log
    of `client_id, item_id, timestamp`): the type of every row, e.g. `purchase`. A `value`
    column is then optional (empty when absent; a `rating` needs one). None: the source has
    the column; a source with it and this given is refused (which would win is unclear)."""
    rating_range: tuple[float, float] = (0.0, 5.0)
    """Valid rating values (inclusive); other ratings are rejected as out_of_range_value."""
    max_timestamp: int | None = None
    """Latest plausible timestamp; later ones are rejected as future_timestamp.
    Default: the time the config is built plus one day."""
    client_attrs: str | None = None
    """Optional client attributes for `events:` sources: client_id, timestamp, one column each."""
    item_attrs: str | None = None
    """Optional item attributes for `events:` sources: item_id, category[, genres ("|"-separated),
    year (release year)]."""
    previous_vocab: str | None = None
    """vocab.json of a previous run: known ids keep their index, new ones are appended."""
    strict: bool = False
    """Fail on any rejected row instead of counting it."""
    overwrite: bool = False
    """Replace an existing output folder (otherwise the job refuses to start)."""
    extra: dict = field(default_factory=dict)
    """Free-form notes copied into metadata.json (e.g. who ran it)."""

    def __post_init__(self):
        if not self.source or ":" not in self.source:
            raise ValueError(f"source must look like KIND:SPEC, got {self.source!r}")
        kind = self.source.split(":", 1)[0]
        if kind not in SOURCE_KINDS:
            raise ValueError(f"unknown source kind {kind!r} ({', '.join(SOURCE_KINDS)})")
        if kind == "synthetic":  # a bad parameter is said before Spark starts (seconds)
            from spark_jobs.synthetic import SyntheticParams

            SyntheticParams.parse(self.source.split(":", 1)[1])
        if not self.out:
            raise ValueError("out must name a folder")
        if self.split not in SPLIT_KINDS:
            raise ValueError(f"split must be one of {SPLIT_KINDS}, got {self.split!r}")
        if isinstance(self.cutoffs, str):  # "T1,T2", as --cutoffs takes them
            self.cutoffs = tuple(self.cutoffs.split(","))
        if self.split == "time":
            if not self.cutoffs or len(self.cutoffs) != 2:
                given = f" (got {','.join(map(str, self.cutoffs))!r})" if self.cutoffs else ""
                raise ValueError(f"split='time' needs two cutoffs=(T1, T2){given} (on the "
                                 "command line: --cutoffs T1,T2, unix seconds or ISO dates)")
            t1, t2 = (parse_time(t) for t in self.cutoffs)
            if not t1 < t2:
                raise ValueError(f"cutoffs must increase: {self.cutoffs[0]} ({t1}) is not "
                                 f"before {self.cutoffs[1]} ({t2})")
            self.cutoffs = (t1, t2)
        elif self.cutoffs is not None:
            raise ValueError("cutoffs only apply to split='time'")
        if self.ties not in TIE_RULES:
            raise ValueError(f"ties must be one of {TIE_RULES}, got {self.ties!r}")
        if self.max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {self.max_len}")
        if self.row_groups < 1:
            raise ValueError(f"row_groups must be >= 1, got {self.row_groups}")
        low, high = self.rating_range
        if not low <= high:
            raise ValueError(f"rating_range must be (low, high), got {self.rating_range}")
        if self.max_timestamp is None:
            self.max_timestamp = int(time.time()) + 86_400
        if self.event_type is not None:
            if kind not in TABLE_KINDS:
                raise ValueError("event_type only applies to events:, table: and delta: sources "
                                 f"(a {kind}: source has its own types)")
            if self.event_type not in EVENT_TYPES:
                raise ValueError(f"event_type must be one of {', '.join(EVENT_TYPES)}, got "
                                 f"{self.event_type!r}")
        if kind not in TABLE_KINDS and (self.client_attrs or self.item_attrs):
            raise ValueError("client_attrs/item_attrs only apply to events:, table: and delta: "
                             "sources")

    @property
    def source_kind(self) -> str:
        return self.source.split(":", 1)[0]

    @property
    def source_spec(self) -> str:
        return self.source.split(":", 1)[1]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def spark_setting(text: str) -> tuple[str, str]:
    """--conf KEY=VALUE as (key, value); without '=' argparse's one line names it (it was
    "dictionary update sequence element #0 has length 1; 2 is required")."""
    key, equals, value = text.partition("=")
    if not (key.strip() and equals):
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. "
                                         "spark.driver.memory=8g)")
    return key.strip(), value
