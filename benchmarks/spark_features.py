"""Benchmark of the Spark feature job on synthetic events (a measurement, not a timed test).

    python benchmarks/spark_features.py            # 1M and 10M events on local[2], recorded
    python benchmarks/spark_features.py --quick    # a few thousand events, not recorded

Reports events/s per size and the cost ratio of the largest to the smallest run (10 when the job
scales linearly), and appends them with the machine, date and git commit to benchmarks/RESULTS.md
under "## Spark feature job". The outputs go to a temporary folder that is removed afterwards.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spark_jobs.build_features import build_features  # noqa: E402
from spark_jobs.config import FeatureConfig  # noqa: E402
from spark_jobs.session import get_spark  # noqa: E402

HEADING = "## Spark feature job"
FULL = (1_000_000, 10_000_000)
QUICK = (2_000, 4_000)
EVENTS_PER_CLIENT = 100


def source_for(events: int, quick: bool) -> str:
    clients = max(10, events // EVENTS_PER_CLIENT)
    items = 500 if quick else 50_000
    return f"synthetic:clients={clients},items={items},events={events},seed=1"


def run_one(spark, events: int, quick: bool, workdir: Path, row_groups: int) -> dict:
    out = workdir / f"features-{events}"
    config = FeatureConfig(
        source=source_for(events, quick), out=str(out), row_groups=row_groups, overwrite=True
    )
    start = time.perf_counter()
    summary = build_features(spark, config)
    seconds = time.perf_counter() - start
    shutil.rmtree(out, ignore_errors=True)
    return {
        "events": summary["counts"]["input_rows"],
        "clients": summary["counts"]["clients"],
        "train_rows": summary["splits"]["train"]["rows"],
        "seconds": seconds,
        "events_per_s": summary["counts"]["input_rows"] / seconds,
        "stages": summary["stage_seconds"],
        "load": os.getloadavg()[0],
    }


def machine() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {model}"


def git_commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
        commit = done.stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"
    return (commit or "no commit") + (" (uncommitted changes)" if dirty else "")


def report(results: list[dict], master: str) -> str:
    lines = [
        f"### {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {master}",
        "",
        f"Machine: {machine()}. Commit: {git_commit()}. Job: synthetic source, leave-last-out, "
        f"max_len 200, 64 row groups per split; seconds from the job start to the renamed output.",
        "",
        "| events | clients | train rows | seconds | events/s "
        "| validate / vocab / examples / write s | load avg after |",
        "| ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for r in results:
        stages = " / ".join(f"{s:.0f}" for s in r["stages"].values())
        lines.append(
            f"| {r['events']:,} | {r['clients']:,} | {r['train_rows']:,} | {r['seconds']:.1f} "
            f"| {r['events_per_s']:,.0f} | {stages} | {r['load']:.1f} |"
        )
    ratio = results[-1]["seconds"] / results[0]["seconds"]
    size = results[-1]["events"] / results[0]["events"]
    lines += [
        "",
        f"Cost ratio {size:.0f}x events: {ratio:.2f}x time (linear = {size:.0f}). A load average "
        "above the core count means other work shared the machine during the run.",
    ]
    return "\n".join(lines) + "\n"


def record(text: str, path: Path = REPO / "benchmarks" / "RESULTS.md") -> None:
    """Append under HEADING (created at the end when missing), before the next `## ` section."""
    body = path.read_text() if path.exists() else "# Benchmark results\n"
    lines = body.rstrip("\n").split("\n")
    if HEADING not in lines:
        lines += ["", HEADING]
    start = lines.index(HEADING)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    lines[end:end] = ["", *text.rstrip("\n").split("\n"), ""]
    path.write_text("\n".join(lines).rstrip("\n") + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    p.add_argument("--master", default="local[2]")
    p.add_argument(
        "--record",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="append to benchmarks/RESULTS.md (default: yes, except with --quick)",
    )
    args = p.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    spark = get_spark(master=args.master, app_name="hvd_ctsm-bench", spark_driver_memory="8g")
    workdir = Path(tempfile.mkdtemp(prefix="ctsm-bench-"))
    try:
        results = []
        for events in sizes:
            results.append(run_one(spark, events, args.quick, workdir, 8 if args.quick else 64))
            print(f"{events:,} events: {results[-1]['seconds']:.1f} s", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    text = report(results, args.master)
    print(text)
    if args.record if args.record is not None else not args.quick:
        record(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
