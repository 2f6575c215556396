"""Quality vs scale ("do no harm"): backtest NDCG@10 at effective batch x1, x2 and x4.

    python benchmarks/quality.py --data FEATURES             # 3 seeds x 6 variants
    python benchmarks/quality.py --data FEATURES --quick     # 1 seed, x1 and x2, a smoke test

The effective batch grows with ranks and backward_passes_per_step: x1 = 1 rank, x2 = 2 ranks,
x4 = 2 ranks x 2 micro-batches. Each size trains with the presets' rule (linear lr scaling from
the effective batch plus warm-up from the unscaled lr), with square-root scaling and the same
warm-up, and with no rule (lr_scaling=none, warmup_steps=0), for the same epochs, over several
seeds run in turn (seed by seed, every variant). Each model is then backtested on the held-out
test split (full ranking, items the client had before masked). The report says whether x2 and x4
stay within x1's spread over seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (NO_TRACKING, RESULTS, horovodrun, run, save, spread,  # noqa: E402
                               work_folder)

RULES = {  # the trainer overrides of each learning-rate rule
    "linear": [],  # the presets' rule: linear scaling from the base batch, with warm-up
    "sqrt": ["optim.lr_scaling=sqrt"],  # square-root scaling, same warm-up
    "none": ["optim.lr_scaling=none", "optim.warmup_steps=0"],
}
VARIANTS = {  # name: (ranks, backward_passes_per_step, rule)
    "x1": (1, 1, "linear"), "x1_norule": (1, 1, "none"),
    "x2": (2, 1, "linear"), "x2_sqrt": (2, 1, "sqrt"), "x2_norule": (2, 1, "none"),
    "x4": (2, 2, "linear"), "x4_sqrt": (2, 2, "sqrt"), "x4_norule": (2, 2, "none"),
}


def train_and_backtest(data: Path, work: Path, name: str, seed: int, epochs: int,
                       settings: list[str]) -> dict:
    from hvd_ctsm.evaluation.backtest import run_backtest

    ranks, micro, rule = VARIANTS[name]
    out = work / f"{name}-s{seed}"
    overrides = [f"seed={seed}", f"epochs={epochs}", f"eval_every_epochs={epochs}",
                 f"dist.backward_passes_per_step={micro}", "progress=false",
                 "dist.threads_per_rank=1", "keep_checkpoints=1", NO_TRACKING, *settings,
                 *RULES[rule]]
    args = ["-m", "hvd_ctsm.train", "--config", "default", "--data", str(data), "--out", str(out),
            "--overwrite", *overrides]
    seconds = run(horovodrun(ranks, args), work / f"{name}-s{seed}.log")
    summary = json.loads((out / "train_summary.json").read_text())
    report = run_backtest(str(data), str(out / "model.pt"), split="test", seed=0)
    return {"variant": name, "seed": seed, "effective_batch": summary["effective_batch"],
            "steps": summary["steps"], "seconds": seconds,
            "ndcg@10": report["model"]["full"]["ndcg@10"],
            "hr@10": report["model"]["full"]["hr@10"],
            "sampled_ndcg@10": report["model"]["sampled"]["ndcg@10"]}


def verdict(table: dict) -> dict:
    """Every larger effective batch against x1's spread over seeds (none without x1)."""
    if "x1" not in table:  # --variants without x1: the table alone, nothing to compare with
        return {}
    base = table["x1"]["ndcg@10"]
    out = {}
    for name in (n for n in table if not n.startswith("x1")):
        if name not in table:
            continue
        m = table[name]["ndcg@10"]["mean"]
        out[name] = {"mean_minus_x1": m - base["mean"],
                     "in_x1_range": base["min"] <= m <= base["max"],
                     "within_2_stdev": abs(m - base["mean"]) <= 2 * max(base["stdev"], 1e-12)}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, type=Path, help="feature job output folder")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--variants", help=f"comma list of {list(VARIANTS)} (default: all)")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="trainer overrides for every run (a candidate default, e.g. "
                   "model.layers=3); the learning-rate rule of each variant still applies")
    p.add_argument("--add-to", type=Path, help="a quality.json of the same data, epochs and "
                   "seeds whose runs are kept (training is deterministic on CPU: a variant run "
                   "again gives the same NDCG to the last digit)")
    args = p.parse_args(argv)
    names = ["x1", "x2"] if args.quick else (
        list(VARIANTS) if args.variants is None else [n for n in args.variants.split(",") if n])
    unknown = set(names) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}")
    seeds, epochs = (1, 1) if args.quick else (args.seeds, args.epochs)
    t0, runs = time.perf_counter(), []
    if args.add_to:
        kept = json.loads(args.add_to.read_text())
        if (kept["epochs"], kept["seeds"], kept.get("settings", [])) != (epochs, seeds, args.set):
            p.error(f"{args.add_to} has other epochs/seeds/--set than this run")
        runs = [r for r in kept["runs"] if r["variant"] not in names]
        wanted = {r["variant"] for r in runs} | set(names)
        names = [n for n in VARIANTS if n in wanted]
    with work_folder(prefix="bench-quality-") as tmp:
        for seed in range(seeds):
            for name in names:
                if any(r["variant"] == name and r["seed"] == seed for r in runs):
                    continue
                runs.append(train_and_backtest(args.data, Path(tmp), name, seed, epochs, args.set))
                print(f"[quality] seed {seed} {name}: ndcg@10 {runs[-1]['ndcg@10']:.4f}",
                      flush=True)
    table = {}
    for name in names:
        rs = [r for r in runs if r["variant"] == name]
        stats = spread(r["ndcg@10"] for r in rs)
        stats["mean"] = statistics.mean(r["ndcg@10"] for r in rs)
        table[name] = {"effective_batch": rs[0]["effective_batch"], "steps": rs[0]["steps"],
                       "lr_rule": VARIANTS[name][2], "ndcg@10": stats,
                       "hr@10": spread(r["hr@10"] for r in rs),
                       "sampled_ndcg@10": spread(r["sampled_ndcg@10"] for r in rs)}
    save("quality", {"data": args.data.name, "epochs": epochs, "seeds": seeds,
                     "settings": args.set, "table": table,
                     "verdict": verdict(table), "runs": runs,
                     "bench_seconds": time.perf_counter() - t0}, args.out)
    print(json.dumps(verdict(table), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
