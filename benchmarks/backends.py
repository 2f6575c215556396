"""Horovod vs torch.distributed in the real trainer: the same run under horovodrun and torchrun.

    python benchmarks/backends.py --data FEATURES --config ml100k --np 2 --epochs 1 --repeats 3

Each repeat runs both backends in turn (H T, H T, ...) so that they share the machine's moments.
Per run, from the trainer's own log: epoch seconds (sum of step times), rows/s, the time shares
(under torch the gradient wait is inside "backward": DDP reduces while backward runs), the wall
time of the whole launch, and the validation NDCG@10. Writes
results/backends_MACHINE_DATE_DATA_EPOCHSep.json with medians over the repeats and the
Horovod/torch ratio of each repeat. With --pair, each repeat also runs one single-rank trainer
alone (each backend's np=2 epoch time against it) and two independent single-rank trainers side
by side (no communication: what two workers reach on this machine; each backend's np=2 rows/s
against the pair of its own repeat). For torch, whose reduction hides inside backward, the
exposed share of communication is the backward seconds per step beyond the pair's, over the
step time.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (RESULTS, horovodrun, machine, run, save, spread,  # noqa: E402
                               torchrun, work_folder)
from benchmarks.scaling import read_train_log, run_np, run_pair, trainer_args  # noqa: E402

BACKENDS = ("horovod", "torch")


def one_run(args, backend: str, work: Path) -> dict:
    out = work / "run"
    overrides = [f"epochs={args.epochs}", f"dist.backend={backend}"]
    launch = horovodrun if backend == "horovod" else torchrun
    wall = run(launch(args.np, trainer_args(args.data, out, args.config, overrides)),
               work / "run.log")
    summary = json.loads((out / "train_summary.json").read_text())
    return read_train_log(out) | {"wall_seconds": wall,
                                  "ndcg@10": summary["validation"]["full"]["ndcg@10"]}


def single_runs(args, kind: str, work: Path) -> dict:
    """np1: one single-rank trainer alone; pair: two at once."""
    if kind == "pair":
        return run_pair(args.data, work, args.config, [f"epochs={args.epochs}"])
    return run_np(1, args.data, work, args.config, [f"epochs={args.epochs}"])


def result_name(stamp: dict, data: str, epochs: int) -> str:
    """backends_<cpu>_<date>_<data>_<epochs>ep: which machine, day, dataset and run length the
    numbers belong to (so that another dataset's or length's run that day replaces nothing)."""
    cpu = re.sub(r"[^a-z0-9]+", "-", stamp["cpu"].lower()).strip("-")[:40]
    data = re.sub(r"[^A-Za-z0-9_.-]+", "-", data)
    return f"backends_{cpu}-{stamp['cores']}c_{stamp['date'][:10]}_{data}_{epochs}ep"


def backend_summary(rs: list[dict]) -> dict:
    return {"epoch_seconds": spread(r["epoch_seconds"] for r in rs),
            "rows_per_s": spread(r["rows_per_s"] for r in rs),
            "wall_seconds": spread(r["wall_seconds"] for r in rs),
            "allreduce_share": spread(r["shares"].get("allreduce", 0.0) for r in rs),
            "backward_share": spread(r["shares"].get("backward", 0.0) for r in rs),
            "ndcg@10": spread(r["ndcg@10"] for r in rs)}


def summarize(runs: dict) -> dict:
    by = {b: backend_summary(runs[b]) for b in BACKENDS}
    pairs = list(zip(runs["horovod"], runs["torch"], strict=True))
    by["horovod_over_torch_rows_per_s"] = spread(h["rows_per_s"] / t["rows_per_s"]
                                                 for h, t in pairs)
    if runs.get("pair"):
        by["pair_rows_per_s"] = spread(p["rows_per_s"] for p in runs["pair"])
        by["np1_epoch_seconds"] = spread(r["epoch_seconds"] for r in runs["np1"])
        for b in BACKENDS:
            by[b]["epoch_time_vs_np1"] = spread(
                r["epoch_seconds"] / one["epoch_seconds"]
                for r, one in zip(runs[b], runs["np1"], strict=True))
            mine = list(zip(runs[b], runs["pair"], strict=True))
            by[b]["efficiency_vs_pair"] = spread(r["rows_per_s"] / p["rows_per_s"]
                                                 for r, p in mine)
            by[b]["backward_beyond_pair_share"] = spread(backward_beyond_pair(r, p)
                                                         for r, p in mine)
    return by


def step_seconds(run: dict, phase: str) -> float:
    return run["epoch_seconds"] / run["steps"] * run["shares"].get(phase, 0.0)


def backward_beyond_pair(run: dict, pair: dict) -> float:
    """Backward seconds per step beyond the pair's (the same per-rank batch, no reduction), over
    the step time: under torch, the part of DDP's reduction that backward does not hide."""
    alone = sum(step_seconds(p, "backward") for p in pair["each"]) / len(pair["each"])
    return (step_seconds(run, "backward") - alone) / (run["epoch_seconds"] / run["steps"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, type=Path)
    p.add_argument("--config", default=None)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--pair", action="store_true",
                   help="also run one single-rank trainer alone and two side by side per "
                        "repeat (np=2 only)")
    args = p.parse_args(argv)
    if args.pair and args.np != 2:
        p.error("--pair compares np=2 with two single-rank trainers: use --np 2")
    kinds = [*BACKENDS, *(["np1", "pair"] if args.pair else [])]
    t0, runs = time.perf_counter(), {kind: [] for kind in kinds}
    for rep in range(args.repeats):
        for kind in kinds:
            with work_folder(prefix="bench-backends-") as tmp:
                runs[kind].append(one_run(args, kind, Path(tmp)) if kind in BACKENDS
                                  else single_runs(args, kind, Path(tmp)))
            print(f"[backends] repeat {rep + 1}: {kind}: "
                  f"{runs[kind][-1]['rows_per_s']:.0f} rows/s", flush=True)
    summary = summarize(runs)
    path = save(result_name(machine(), args.data.name, args.epochs), {
        "data": args.data.name, "config": args.config, "np": args.np, "epochs": args.epochs,
        "repeats": args.repeats, "summary": summary, "runs": runs,
        "bench_seconds": time.perf_counter() - t0}, args.out)
    print(f"[backends] wrote {path}")
    print(json.dumps({k: v["median"] if "median" in v else {m: s["median"] for m, s in v.items()}
                      for k, v in summary.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
