"""The driver's heap for a job that starts its own local Spark, chosen from the input's size.

In local mode every task runs in the driver's JVM, so its heap is all the memory the job has,
and it can only be set before the JVM starts. Measured on 2 cores (benchmarks/SCALE.md):
10^7 events ran in the 4g default (slowly: a third of the speed per event of the runs below);
5x10^7 ran out of it; 3x10^7 ran in 12g and 5x10^7 in 16g. So about 0.32 GB for every 10^6
events, never below the 4g default, and at most 70% of the machine's memory (Spark's Python
workers need the rest). A heap is a ceiling, not an allocation: a small input in a large heap
costs nothing.

A setting the user gave (--conf spark.driver.memory=..., spark-submit's own) always wins; a
session already running (a notebook's) or a cluster master is left alone.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from hvd_ctsm.files import storage
from hvd_ctsm.spark_session import STARTUP_CONF, setting_name

SETTING = "spark.driver.memory"
DEFAULT_GB = int(STARTUP_CONF[SETTING].removesuffix("g"))  # what every session we start gets
GB_PER_MILLION_EVENTS = 0.32
MACHINE_SHARE = 0.7
# Bytes an event takes on disk, on the small side so that a file's events are not undercounted
# (measured: MovieLens' u.data 19.8 a rating; 10^6 synthetic events with numeric ids 33.9 as
# CSV and 8.7 as Parquet; gzip: u.data 5.0, 10^6 purchases of numeric ids 7.8, bzip2 7.6).
TEXT_BYTES_PER_EVENT = 20
PARQUET_BYTES_PER_EVENT = 8
COMPRESSED_BYTES_PER_EVENT = 5


@dataclass(frozen=True)
class HeapChoice:
    events: int  # the input's events, counted or estimated from its size on disk
    wanted_gb: int  # what GB_PER_MILLION_EVENTS asks for (at least DEFAULT_GB)
    gb: int  # what the machine allows of it

    @property
    def setting(self) -> str:
        return f"{self.gb}g"

    def message(self, machine_gb: float) -> str:
        said = (f"Spark driver heap {self.setting} for about {self.events:,} input events "
                f"(local mode; --conf {SETTING}=... sets it)")
        if self.gb < self.wanted_gb:
            said += (f"; they want about {self.wanted_gb}g, more than this machine's "
                     f"{machine_gb:.0f} GiB can give: if the job runs out of memory, run it on "
                     "a cluster (--master) or on fewer events")
        return said


def choose(events: int, machine_bytes: int | None) -> HeapChoice:
    wanted = max(DEFAULT_GB, math.ceil(events / 1e6 * GB_PER_MILLION_EVENTS))
    if machine_bytes is None:
        return HeapChoice(events, wanted, wanted)
    allowed = max(DEFAULT_GB, int(machine_bytes * MACHINE_SHARE / 2**30))
    return HeapChoice(events, wanted, min(wanted, allowed))


def estimated_events(source: str) -> int | None:
    """The events a `--source` holds: a synthetic source says; a local file or folder is
    estimated from its size; a table or a remote URL is not known before Spark reads it."""
    kind, _, spec = source.partition(":")
    if kind == "synthetic":
        from spark_jobs.synthetic import SyntheticParams

        return SyntheticParams.parse(spec).events
    if kind == "movielens":
        ratings = Path(spec) / "u.data"
        return ratings.stat().st_size // TEXT_BYTES_PER_EVENT if ratings.is_file() else None
    if kind in ("events", "delta") and not storage.is_remote(spec):
        return _events_in_files(storage.local_path(spec))
    return None


def _events_in_files(path: Path) -> int | None:
    if not path.exists():
        return None  # the source's own check says so, in its words
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    events = 0
    per_event = {".parquet": PARQUET_BYTES_PER_EVENT, ".gz": COMPRESSED_BYTES_PER_EVENT,
                 ".bz2": COMPRESSED_BYTES_PER_EVENT}
    for file in files:
        events += file.stat().st_size // per_event.get(file.suffix.lower(), TEXT_BYTES_PER_EVENT)
    return events


def machine_memory() -> int | None:
    """Bytes of memory this process may use: the machine's, or its container's limit if lower."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    limit = Path("/sys/fs/cgroup/memory.max")  # cgroup v2; "max" when unlimited
    try:
        text = limit.read_text().strip()
        if text.isdigit():
            total = min(total, int(text))
    except OSError:
        pass
    return total


def local_heap_conf(source: str, master: str | None, conf: dict) -> tuple[dict, str | None]:
    """({spark.driver.memory: ...} or {}, the line to tell the user or None) for a job about to
    start its own session on `master` (already resolved: None under spark-submit)."""
    from pyspark.sql import SparkSession

    asked = any(setting_name(key) == SETTING for key in conf)
    if asked or master is None or not master.startswith("local"):
        return {}, None
    if SparkSession.getActiveSession() is not None:
        return {}, None
    try:
        events = estimated_events(source)
    except (ValueError, OSError):
        return {}, None  # a bad source is reported by the job itself, with its fix
    if events is None:
        return {}, None
    machine = machine_memory()
    choice = choose(events, machine)
    if choice.gb == DEFAULT_GB and choice.wanted_gb == DEFAULT_GB:
        return {}, None
    return {SETTING: choice.setting}, choice.message((machine or 0) / 2**30)


def sized_spark(source: str, master: str | None, prog: str, conf: dict | None = None,
                **options):
    """get_spark(master, **options, **conf), with the driver heap local_heap_conf chooses for
    `source` (`master` already resolved), said in one line on stderr under `prog`'s name."""
    conf = dict(conf or {})
    heap, said = local_heap_conf(source, master, conf)
    if said:
        print(f"{prog}: {said}", file=sys.stderr)
    from spark_jobs import session  # the jobs' one way to a session

    return session.get_spark(master=master, **options, **conf, **heap)
