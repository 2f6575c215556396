"""Benchmark of the Spark feature job on synthetic events (a measurement, not a timed test).

    python benchmarks/spark_features.py            # 1M and 10M events on local[2]
    python benchmarks/spark_features.py --quick    # a few thousand events, a smoke test

Reports events/s per size and the cost ratio of the largest to the smallest run (10 when the job
scales linearly) into benchmarks/results/spark_features.json, with the machine, date and commit;
benchmarks/report.py renders it into RESULTS.md. The job's outputs go to a temporary folder that
is removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import RESULTS, save  # noqa: E402
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


def render(payload: dict) -> str:
    """The RESULTS.md section of one saved run."""
    results, master = payload["results"], payload["master"]
    lines = [
        f"Spark `{master}`. Job: synthetic source, leave-last-out, max_len 200, 64 row groups "
        "per split; seconds from the job start to the renamed output.",
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder of the results JSON")
    args = p.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    spark = get_spark(master=args.master, app_name="hvd_ctsm-bench", spark_driver_memory="8g")
    workdir = Path(tempfile.mkdtemp(prefix="ctsm-bench-"))
    try:
        results = []
        for events in sizes:
            results.append(run_one(spark, events, args.quick, workdir, 2 if args.quick else 64))
            print(f"{events:,} events: {results[-1]['seconds']:.1f} s", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    payload = {"master": args.master, "quick": args.quick, "results": results}
    save("spark_features", payload, args.out)
    print(render(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
