"""The feature job: raw events -> validated, time-safe per-client sequences -> Petastorm datasets.

    python -m spark_jobs.build_features --source movielens:PATH --out DIR --split leave-last-out
    spark-submit spark_jobs/build_features.py --source synthetic:clients=1000,events=50000 --out DIR
    build_features(spark, FeatureConfig(...))  # from a notebook with its own SparkSession

Output: DIR/{train,validation,test,serving} (Petastorm, hvd_ctsm.data.schema), DIR/vocab.json and
DIR/metadata.json. `serving` holds every client's latest events (all of them) for batch scoring.
The whole folder is built in a temporary sibling and renamed into place when complete.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import functions as F

import hvd_ctsm
from hvd_ctsm.data.schema import EVENT_TYPES, OUTPUT_SPLITS, SCHEMA_VERSION, SERVING_SPLIT
from hvd_ctsm.errors import (BAD_INPUT_ERRORS, EXIT_BAD_INPUT, EXIT_CRASH, arg_parser, one_line,
                             run_cli)
from hvd_ctsm.files import outputs, storage
from hvd_ctsm.files.storage import location
from spark_jobs import attributes, sequences, split, validate, vocab, write
from spark_jobs.config import (CUTOFFS_HELP, EVENT_TYPE_HELP, SPLIT_HELP, FeatureConfig, parse_time,
                               spark_setting)
from spark_jobs.sources import load_source
from spark_jobs.summary import dataset_warnings, day, no_examples_error, summary_table

PROG = "hvd-ctsm features"  # the name its one-line errors start with (also as hvd-ctsm-features)


def code_version() -> str:
    version = hvd_ctsm.__version__
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{version}+{commit}" if commit else version


def _validated(spark, config, source):
    """(used events, counts); counts are checked against an independent count of the input."""
    flagged = validate.flag_invalid(source.events, config.max_timestamp, config.rating_range)
    counted = validate.count_copies(flagged).persist(StorageLevel.MEMORY_AND_DISK)
    counts = validate.accounting(counted)
    seen = source.events.count()
    if seen != counts["input_rows"]:  # would be a bug in the accounting itself
        raise RuntimeError(f"row accounting: {seen} input rows but {counts['input_rows']} counted")
    if config.strict:
        validate.raise_if_strict(counts)
    used = validate.used_events(counted)
    distinct = used.agg(
        F.countDistinct("client_id").alias("c"), F.countDistinct("item_id").alias("i"),
        F.min("timestamp").alias("t0"), F.max("timestamp").alias("t1"),
        F.max(F.pmod("timestamp", F.lit(86_400))).alias("seconds_in_day"),
    )
    row = distinct.first()  # the time range: what --cutoffs must fall inside
    counts.update(clients=row["c"], items=row["i"], first_event=row["t0"], last_event=row["t1"],
                  whole_day_timestamps=row["seconds_in_day"] == 0)  # dates: ties are days
    return used, counted, counts


def _examples(config, source, used, vocabulary, n_used: int):
    events = sequences.add_labels(vocab.index_items(used, vocabulary), config.label_min_rating)
    names = list(vocabulary["attrs"])
    indexed = None
    if source.client_attrs is not None and names:
        indexed = attributes.index_attrs(source.client_attrs, vocabulary["attrs"])
    events = attributes.attach_attrs(events, indexed, names)
    roles = split.assign_roles(events, config.split, config.cutoffs)
    # ~10k events per pandas call: large enough to amortise its overhead, small in memory
    buckets = min(4096, max(16, n_used // 10_000))
    return sequences.build_examples(roles, config.max_len, len(names), buckets, config.ties)


def _split_stats(examples) -> dict:
    """{split: Row(rows, targets)}; computing it materialises the persisted examples."""
    rows = examples.groupBy("split").agg(
        F.count(F.lit(1)).alias("rows"), F.sum("n_targets").alias("targets")
    )
    return {r["split"]: r for r in rows.collect()}


def _check_serving_rows(stats: dict, clients: int) -> None:
    """Every client with a used event has exactly one serving row (else a bug, not bad input)."""
    rows = stats[SERVING_SPLIT]["rows"] if SERVING_SPLIT in stats else 0
    if rows != clients:
        raise RuntimeError(f"row accounting: {clients} clients but {rows} serving rows")


def check_output(config: FeatureConfig) -> None:
    """Refuse an --out the job may not write (an input, someone else's folder, an existing URL)
    before any work; the job checks again when it writes."""
    if storage.is_remote(config.out):
        outputs.check_new_url(config.out, input_paths(config))
    else:
        outputs.check_output(Path(config.out), config.overwrite, "features", input_paths(config))


def input_paths(config: FeatureConfig) -> list[str]:
    """Every file or folder the job reads: the output may not overlap any of them."""
    paths = [config.client_attrs, config.item_attrs, config.previous_vocab]
    if config.source_kind in ("events", "delta", "movielens"):
        paths.append(config.source_spec)
    return [p for p in paths if p]


def _held_out_counts(stats: dict) -> dict:
    """From the examples' marker rows, per held-out split: the clients without an earlier event,
    those of them whose earlier events all share their timestamp, and the targets that repeat
    an item the client had (sequences.examples_of_client)."""
    counts: dict[str, dict] = {"clients_without_history": {},
                               "clients_with_tied_history_only": {}, "repeat_targets": {}}
    for name in ("validation", "test"):
        tied = _marker_rows(stats, f"{name}_tied")
        counts["clients_without_history"][name] = _marker_rows(stats, f"{name}_skipped") + tied
        counts["clients_with_tied_history_only"][name] = tied
        counts["repeat_targets"][name] = _marker_rows(stats, f"{name}_repeat")
    return counts


def _write_splits(config, examples, stats: dict, stage: Path, counts: dict) -> dict:
    """Each split's metadata, once written."""
    names = list(sequences.COLUMNS)
    splits = {}
    for name in OUTPUT_SPLITS:
        rows = stats[name]["rows"] if name in stats else 0
        if rows == 0:
            raise no_examples_error(name, counts, config)
        data = examples.filter(F.col("split") == name).select(*names)
        started = time.time()
        groups = write.write_dataset(data, stage / name, rows, config.row_groups)
        progress(f"wrote {name}: {rows:,} rows, {groups} row groups "
                 f"({time.time() - started:.0f} s)")
        splits[name] = {
            "rows": rows,
            "targets": int(stats[name]["targets"]),
            "row_groups": groups,
            "path": name,
            "files": write.file_listing(stage / name),
        }
    return splits


def _marker_rows(stats: dict, marker: str) -> int:
    return stats[marker]["rows"] if marker in stats else 0


def _metadata(config, counts, vocabulary, splits, seconds) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "code_version": code_version(),
        "source": config.source,
        "split": {
            "kind": config.split,
            "cutoffs": list(config.cutoffs) if config.cutoffs else None,
        },
        "max_len": config.max_len,
        "ties": config.ties,
        "vocab": vocab.vocab_sizes(vocabulary),
        "vocab_sha256": vocab.vocab_sha256(vocabulary),  # of vocab.json's bytes
        "attrs": list(vocabulary["attrs"]),
        "counts": counts,
        "splits": splits,
        "row_groups_requested": config.row_groups,
        "label_min_rating": config.label_min_rating,
        "max_timestamp": config.max_timestamp,
        "rating_range": list(config.rating_range),
        "event_type": config.event_type,  # every row's type, where the source had no column
        "previous_vocab": config.previous_vocab,
        "extra": config.extra,
        "seconds": round(seconds, 2),
    }


def build_features(spark, config: FeatureConfig) -> dict:
    """Run the job in an existing SparkSession; returns the metadata (plus `out` and warnings,
    each also printed to stderr as a `warning: ...` line).

    Any session will do (a notebook's too): its executors are checked first, and the settings
    the job depends on (UTC parsing, shuffle partitions) apply while it runs."""
    from hvd_ctsm.spark_session import spark_log_kept_back
    from spark_jobs.session import check_executors, job_settings

    check_executors(spark)
    with spark_log_kept_back():  # a full disk's line alone, not after each task's trace
        if not storage.is_remote(config.out):
            with job_settings(spark):
                summary = _build(spark, config)
        else:
            summary = _build_and_upload(spark, config, job_settings)
    for warning in summary["warnings"]:  # here, so the notebook and the pipeline say them too
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    return summary


def _build_and_upload(spark, config: FeatureConfig, job_settings) -> dict:
    """Build the dataset in a local temporary folder on the driver, then upload it to the URL
    config.out, metadata.json last (readers look for it first). Spark writes the files to the
    driver's disk, so this suits local mode; on a multi-node cluster write to storage every
    executor shares instead (/dbfs/..., a shared mount)."""
    outputs.check_new_url(config.out, input_paths(config))
    scratch = Path(tempfile.mkdtemp(prefix="hvd_ctsm-features-"))
    try:
        local = dataclasses.replace(config, out=str(scratch / "features"), overwrite=False)
        with job_settings(spark):
            summary = _build(spark, local)
        storage.upload_folder(scratch / "features", config.out, last="metadata.json")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {**summary, "out": config.out}


def progress(line: str) -> None:
    """One line as each stage ends (at 5x10^7 events a stage takes minutes), on stdout before
    the summary table: stderr holds only what went wrong (one line) and warnings."""
    print(f"features: {line}", flush=True)


def _build(spark, config: FeatureConfig) -> dict:
    start = last = time.time()
    stages = {}

    def lap(name, done):  # wall seconds per stage, kept in metadata for benchmarks
        nonlocal last
        stages[name], last = round(time.time() - last, 2), time.time()
        progress(f"{done} ({stages[name]:.0f} s; {last - start:.0f} s in all)")

    counted = examples = None
    try:
        with outputs.staged(config.out, config.overwrite, "features",
                            input_paths(config)) as stage:
            previous = vocab.load_vocab(config.previous_vocab)  # before the events: seconds
            progress(f"reading and checking the events of {config.source}")
            source = load_source(spark, config)
            used, counted, counts = _validated(spark, config, source)
            lap("validate", f"{counts['input_rows']:,} events read, {counts['used']:,} used, "
                f"{sum(counts['rejected'].values()):,} rejected; {counts['clients']:,} clients, "
                f"{counts['items']:,} items; {day(counts['first_event'])} to "
                f"{day(counts['last_event'])} UTC")
            vocabulary = vocab.build_vocab(used, source.item_attrs, source.client_attrs, previous)
            lap("vocabulary", "vocabularies made")
            examples = _examples(config, source, used, vocabulary, counts["used"]).persist(
                StorageLevel.MEMORY_AND_DISK
            )
            stats = _split_stats(examples)
            _check_serving_rows(stats, counts["clients"])
            counts.update(_held_out_counts(stats))
            lap("examples", "examples: " + ", ".join(
                f"{stats[name]['rows']:,} {name}" for name in OUTPUT_SPLITS if name in stats))
            splits = _write_splits(config, examples, stats, stage, counts)
            write.write_atomic(stage / "vocab.json", vocab.vocab_bytes(vocabulary))
            lap("write", "every split written")
            meta = _metadata(config, counts, vocabulary, splits, time.time() - start)
            meta["stage_seconds"] = stages
            write.write_json_atomic(stage / "metadata.json", meta)
    finally:
        for frame in (counted, examples):
            if frame is not None:
                with contextlib.suppress(Exception):  # a dead JVM: keep the error that killed it
                    frame.unpersist()
    warnings = dataset_warnings(meta, config.row_groups)
    return {**meta, "out": str(Path(config.out)), "warnings": warnings}


def parse_args(argv=None) -> argparse.Namespace:
    p = arg_parser(PROG, __doc__.split("\n")[0])
    p.add_argument(
        "--source", required=True,
        help="movielens:DIR | synthetic:k=v,... | events:PATH-OR-URL | table:NAME | delta:PATH. "
        "events: CSV files with a header (.csv, .tsv, also .gz or .bz2), or Parquet, with the "
        "columns client_id, item_id, "
        "timestamp (unix seconds, or an ISO date or date-time, read as UTC), event_type "
        "(purchase, rating, view or profile) and value (a rating's value; for other events a "
        "non-negative amount, or empty); each row is used or counted as rejected with its reason",
    )
    p.add_argument("--out", type=location, required=True,
                   help="output folder, or a URL (s3://...) to upload to")
    p.add_argument("--split", choices=("time", "leave-last-out"), default="leave-last-out",
                   help=SPLIT_HELP)
    p.add_argument("--cutoffs", help=CUTOFFS_HELP)
    p.add_argument("--max-len", type=int, default=200, help="longest history (default 200)")
    p.add_argument(
        "--ties",
        choices=("strict", "input-order"),
        default="strict",
        help="same-timestamp events: strict (default, leakage-safe: none is history for "
        "another) or input-order (the input's row order taken as time, as published MovieLens "
        "results do: for comparing with them only; benchmarks/QUALITY.md)",
    )
    p.add_argument("--row-groups", type=int, default=64, help="least row groups per split")
    p.add_argument("--label-min-rating", type=float, default=4.0,
                   help="a rating at least this is a positive label for the p(sale) head, as a "
                        "purchase is (default 4)")
    p.add_argument("--rating-range", default="0,5", help="valid ratings LOW,HIGH (default 0,5)")
    p.add_argument("--event-type", choices=EVENT_TYPES, help=EVENT_TYPE_HELP)
    p.add_argument("--max-timestamp", help="latest valid timestamp (default: now + 1 day)")
    p.add_argument("--client-attrs", help="client attributes table (events: sources)")
    p.add_argument("--item-attrs", help="item attributes table (events: sources)")
    p.add_argument("--previous-vocab", type=location,
                   help="the vocabulary to extend (every known id keeps its index): a vocab.json, "
                        "or the dataset, registry or registry version holding one")
    p.add_argument("--strict", action="store_true", help="fail instead of rejecting rows")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", type=spark_setting,
                   help="Spark setting")
    return p.parse_args(argv)



def config_from_args(args) -> FeatureConfig:
    low, high = (float(x) for x in args.rating_range.split(","))
    return FeatureConfig(
        source=args.source,
        out=args.out,
        split=args.split,
        cutoffs=args.cutoffs,
        max_len=args.max_len,
        ties=args.ties,
        row_groups=args.row_groups,
        label_min_rating=args.label_min_rating,
        rating_range=(low, high),
        event_type=args.event_type,
        max_timestamp=parse_time(args.max_timestamp) if args.max_timestamp else None,
        client_attrs=args.client_attrs,
        item_attrs=args.item_attrs,
        previous_vocab=args.previous_vocab,
        strict=args.strict,
        overwrite=args.overwrite,
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as err:
        print(f"{PROG}: bad arguments: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from spark_jobs.driver_heap import sized_spark
    from spark_jobs.session import ExecutorPythonError, resolve_master

    try:  # an output we may not write stops here, before Spark starts (about 10 s)
        check_output(config)
        spark = sized_spark(config.source, resolve_master(args.master), PROG,
                            dict(args.conf))
        summary = build_features(spark, config)
    except ExecutorPythonError as err:  # the executors' Python cannot run the job: 3
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return EXIT_CRASH
    except BAD_INPUT_ERRORS as err:
        print(f"{PROG}: error: {one_line(err)}", file=sys.stderr)  # bad input: 2
        return EXIT_BAD_INPUT
    print(summary_table(summary))
    print(f"wrote {summary['out']}")
    return 0


def cli() -> None:
    sys.exit(run_cli(main, PROG))  # a crash: one line and exit 3 (--debug)


if __name__ == "__main__":
    cli()
