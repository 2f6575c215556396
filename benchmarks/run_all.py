"""Every benchmark in one run, then the report: what `./run.sh bench` does.

    python benchmarks/run_all.py                 # the full set (see below for how long)
    python benchmarks/run_all.py --quick --out D # tiny sizes, results in D, for the smoke test
    python benchmarks/run_all.py --only comm,quality

Datasets are built by the real feature job into a temporary folder that is removed at the end
(MovieLens-derived data never lands in the repository): MovieLens 100K (../shared/data/ml-100k or
--ml100k) for scaling and the input pipeline, a synthetic set for the knobs and the quality runs.
Everything but the quality report takes about half an hour on 2 cores; the report
(quality_report.py) trains each of its cells the log lacks, hours on 2 cores the first time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import (comm, input_pipeline, quality, quality_report, report,  # noqa: E402
                        scaling, spark_features, trainer_ab)
from benchmarks.common import (ML100K, REPO, RESULTS, SYNTHETIC, build_features,  # noqa: E402
                               work_folder)

SYNTHETIC_QUICK = "synthetic:clients=200,items=60,events=8000,seed=7"
ALL = ("scaling", "input", "comm", "quality", "spark", "ab")
QUICK_OUT = REPO / "runs" / "bench-quick"
# Trainer settings whose defaults rest on a side-by-side check: (name, np, epochs, variants).
AB_CHECKS = [("read_ahead", 2, 3, ["data.read_ahead_steps=0", "data.read_ahead_steps=4"]),
             ("sleeping_wait_np2", 2, 1, ["dist.sleeping_wait=false", "dist.sleeping_wait=true"]),
             ("sleeping_wait_np4", 4, 1, ["dist.sleeping_wait=false", "dist.sleeping_wait=true"])]


def ab_checks(data: Path, config: list[str], quick: bool, out: list[str]) -> None:
    for name, np, epochs, variants in AB_CHECKS[:1] if quick else AB_CHECKS:
        trainer_ab.main(["--data", str(data), *config, "--np", str(np),
                         "--epochs", str(2 if quick else epochs), "--name", name,
                         "--repeats", "1" if quick else "3",
                         *(a for v in variants for a in ("--variant", v)), *out])


def datasets(work: Path, ml100k: Path, quick: bool) -> tuple[Path, Path, str | None]:
    """(data for scaling/input, synthetic data, trainer preset for the first)."""
    if quick:
        syn = build_features(SYNTHETIC_QUICK, work / "syn", work / "syn.log", max_len=30)
        return syn, syn, "default"
    syn = build_features(SYNTHETIC, work / "syn", work / "syn.log", max_len=50)
    if not (ml100k / "u.data").exists():
        print(f"[bench] no MovieLens 100K at {ml100k}: scaling runs on synthetic data")
        return syn, syn, "default"
    real = build_features(f"movielens:{ml100k}", work / "ml100k", work / "ml100k.log")
    return real, syn, "ml100k"


def quality_report_args(args, syn: Path) -> list[str]:
    if args.quick:
        return ["--quick", "--data", str(syn), "--out", str(args.out)]
    return ["--run", "--ml100k", str(args.ml100k), "--out", str(args.out)]


def main(argv=None, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog, description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", default=",".join(ALL), help=f"comma list of {ALL}")
    p.add_argument("--ml100k", type=Path, default=ML100K)
    p.add_argument("--out", type=Path, default=None,
                   help=f"results folder (default {RESULTS.relative_to(REPO)}; with --quick "
                        f"{QUICK_OUT.relative_to(REPO)}, so a smoke run never overwrites the "
                        "measured results)")
    p.add_argument("--report", type=Path, default=None,
                   help="the report (default benchmarks/RESULTS.md; with --quick, RESULTS.md "
                        "in the results folder)")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = QUICK_OUT if args.quick else RESULTS
    if args.report is None:
        args.report = (args.out / "RESULTS.md" if args.quick
                       else REPO / "benchmarks" / "RESULTS.md")
    only = set(args.only.split(","))
    unknown = only - set(ALL)
    if unknown:
        p.error(f"unknown benchmarks {sorted(unknown)}; known: {', '.join(ALL)}")
    quick = ["--quick"] if args.quick else []
    out = ["--out", str(args.out)]
    t0 = time.perf_counter()
    with work_folder(prefix="bench-data-") as tmp:
        real, syn, preset = datasets(Path(tmp), args.ml100k, args.quick)
        config = ["--config", preset] if preset else []
        steps = [("scaling", lambda: scaling.main(["--data", str(real), *config, *quick, *out])),
                 ("input", lambda: input_pipeline.main(
                     ["--data", str(real), "--scaling", str(args.out / "scaling.json"), *config,
                      *quick, *out])),
                 ("comm", lambda: comm.main(["--data", str(syn), *quick, *out])),
                 ("quality", lambda: (quality.main(["--data", str(syn), *quick, *out]),
                                      quality_report.main(quality_report_args(args, syn)))),
                 ("spark", lambda: spark_features.main([*quick, *out])),
                 ("ab", lambda: ab_checks(real, config, args.quick, out))]
        for name, step in steps:
            if name in only:
                started = time.perf_counter()
                print(f"[bench] {name} ...", flush=True)
                step()
                print(f"[bench] {name} done in {time.perf_counter() - started:.0f} s", flush=True)
    report.main(["--results", str(args.out), "--out", str(args.report)])
    print(f"[bench] all done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
