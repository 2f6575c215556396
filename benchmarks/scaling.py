"""Scaling of the real trainer: epoch time and allreduce wait at np=1, 2 and 4 (Gloo, CPU).

    python benchmarks/scaling.py --data FEATURES          # 3 repeats of np=1, 2, 4 and a pair
    python benchmarks/scaling.py --data FEATURES --quick  # np=1 and 2 once, a smoke test

Each repeat runs, in turn: `horovodrun -np N python -m hvd_ctsm.train` for N in 1, 2, 4 (4 is
oversubscribed on 2 cores), and two independent single-rank trainers started at the same moment
(no communication: the machine's own limit for two workers). Every run is one epoch of the same
data with one torch thread per rank. Times come from the trainer's own per-step timers
(train_log.jsonl: mean step seconds and the share of each phase, averaged over ranks), so
process start-up and validation are not counted: epoch time = the sum of step times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (NO_TRACKING, RESULTS, env, horovodrun, pyplot, run,  # noqa: E402
                               save, spread, work_folder)

TRAIN = ["-m", "hvd_ctsm.train"]


def trainer_args(data: Path, out: Path, config: str | None, extra: list[str]) -> list[str]:
    args = [*TRAIN, "--data", str(data), "--out", str(out), "--overwrite", "epochs=1",
            "progress=false", "log_every_steps=5", "dist.threads_per_rank=1", "keep_checkpoints=1",
            NO_TRACKING]
    return args + (["--config", config] if config else []) + extra


def read_train_log(out: Path) -> dict:
    """Epoch seconds (sum of step times), rows/s and time shares from the trainer's own log."""
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    summary = json.loads((out / "train_summary.json").read_text())
    seconds, shares, last = 0.0, {}, 0
    for rec in records:
        steps = rec["step"] - last
        last = rec["step"]
        seconds += rec["time/step_seconds"] * steps
        for key, value in rec.items():
            if key.startswith("time_share/"):
                shares[key.split("/")[1]] = shares.get(key.split("/")[1], 0.0) + value * steps
    rows = summary["steps"] * summary["effective_batch"]
    return {"epoch_seconds": seconds, "rows": rows, "rows_per_s": rows / seconds,
            "ranks": summary["ranks"], "steps": summary["steps"],
            "shares": {k: v / max(last, 1) for k, v in shares.items()}}


def run_np(np: int, data: Path, work: Path, config: str | None, extra: list[str]) -> dict:
    out = work / f"np{np}"
    run(horovodrun(np, trainer_args(data, out, config, extra)), work / f"np{np}.log")
    return read_train_log(out)


def wait_split_per_step(data: Path, work: Path, config: str | None, extra: list[str]) -> dict:
    """An np=2 run logged every step (not timed: logging is a collective): the average wait
    against the least-waiting rank's, per step. In 5-step intervals the least-waiting rank
    changes within the interval, so only per-step records separate the allreduce itself from
    waiting for a slower peer."""
    out = work / "np2-per-step"
    run(horovodrun(2, trainer_args(data, out, config, [*extra, "log_every_steps=1"])),
        work / "np2-per-step.log")
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    records = records[1:] or records  # the first step holds start-up skew between the ranks
    waits = [r["step_time"]["wait_s_by_rank"] for r in records]
    seconds = sum(r["time/step_seconds"] for r in records)
    return {"steps": len(records),
            "allreduce_share": sum(sum(w) / len(w) for w in waits) / seconds,
            "least_waiting_rank_share": sum(min(w) for w in waits) / seconds}


def run_pair(data: Path, work: Path, config: str | None, extra: list[str]) -> dict:
    """Two independent single-rank trainers at once: what two workers reach with no comm."""
    procs, outs = [], []
    for i in range(2):
        out = work / f"pair{i}"
        outs.append(out)
        log = open(work / f"pair{i}.log", "w")  # noqa: SIM115  closed when the process ends
        procs.append((subprocess.Popen([sys.executable, *trainer_args(data, out, config, extra)],
                                       stdout=log, stderr=subprocess.STDOUT, env=env()), log))
    for proc, log in procs:
        code = proc.wait(timeout=1800)
        log.close()
        if code:
            raise RuntimeError(f"a paired trainer exited {code}: see {log.name}")
    each = [read_train_log(out) for out in outs]
    return {"rows_per_s": sum(e["rows_per_s"] for e in each), "each": each}


def measure(data: Path, sizes: list[int], repeats: int, config: str | None,
            extra: list[str], pair: bool) -> dict:
    runs = {f"np{n}": [] for n in sizes} | ({"pair": []} if pair else {})
    with work_folder(prefix="bench-scaling-") as tmp:
        for rep in range(repeats):
            for n in sizes:
                runs[f"np{n}"].append(run_np(n, data, Path(tmp), config, extra))
                print(f"[scaling] repeat {rep + 1}/{repeats} np={n}: "
                      f"{runs[f'np{n}'][-1]['epoch_seconds']:.1f} s", flush=True)
            if pair:
                runs["pair"].append(run_pair(data, Path(tmp), config, extra))
            if 2 in sizes:
                runs.setdefault("np2_per_step", []).append(
                    wait_split_per_step(data, Path(tmp), config, extra))
    return runs


def summarise(runs: dict, sizes: list[int]) -> dict:
    base = spread(r["epoch_seconds"] for r in runs["np1"])["median"]
    table = {}
    for n in sizes:
        rs = runs[f"np{n}"]
        table[n] = {"epoch_seconds": spread(r["epoch_seconds"] for r in rs),
                    "rows_per_s": spread(r["rows_per_s"] for r in rs),
                    "time_vs_np1": spread(r["epoch_seconds"] / base for r in rs)["median"],
                    "allreduce_share": spread(r["shares"].get("allreduce", 0) for r in rs),
                    "data_share": spread(r["shares"].get("data", 0) for r in rs),
                    "oversubscribed": n > (os.cpu_count() or 1)}
    out = {"sizes": table}
    if "pair" in runs and 2 in sizes:
        # Repeat by repeat: the np=2 job against the pair measured in the same repeat.
        ratios = [a["rows_per_s"] / b["rows_per_s"]
                  for a, b in zip(runs["np2"], runs["pair"], strict=True)]
        out["pair_rows_per_s"] = spread(r["rows_per_s"] for r in runs["pair"])
        out["np2_efficiency_vs_pair"] = spread(ratios)
    if "np2_per_step" in runs:
        out["np2_wait_split_per_step"] = {
            k: spread(r[k] for r in runs["np2_per_step"])
            for k in ("allreduce_share", "least_waiting_rank_share")}
    return out


def plot(summary: dict, out_dir: Path) -> list[Path]:
    plt = pyplot()
    sizes = sorted(int(n) for n in summary["sizes"])
    time_ratio = [summary["sizes"][n]["time_vs_np1"] for n in sizes]
    comm = [100 * summary["sizes"][n]["allreduce_share"]["median"] for n in sizes]
    paths = [out_dir / "scaling_time.png", out_dir / "scaling_comm.png"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(sizes, time_ratio, "o-", label="measured")
    ax.plot(sizes, [1 / n for n in sizes], "k--", label="ideal (1/N)")
    ax.set(xlabel="workers (Horovod ranks, Gloo, CPU)", ylabel="epoch time / one worker",
           xticks=sizes, title="Epoch time vs workers")
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths[0], dpi=100)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar([str(n) for n in sizes], comm)
    ax.set(xlabel="workers", ylabel="% of step time waiting on allreduce",
           title="Communication share vs workers")
    fig.tight_layout()
    fig.savefig(paths[1], dpi=100)
    plt.close("all")
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, type=Path, help="feature job output folder")
    p.add_argument("--config", help="trainer preset or YAML (e.g. ml100k)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true", help="np=1 and 2, once, no pair")
    p.add_argument("overrides", nargs="*", help="extra trainer overrides, e.g. data.batch_size=64")
    args = p.parse_args(argv)
    sizes = [1, 2] if args.quick else [1, 2, 4]
    repeats = 1 if args.quick else args.repeats
    t0 = time.perf_counter()
    runs = measure(args.data, sizes, repeats, args.config, args.overrides, pair=not args.quick)
    summary = summarise(runs, sizes)
    args.out.mkdir(parents=True, exist_ok=True)
    plots = plot(summary, args.out)
    save("scaling", {"data": args.data.name, "config": args.config or "default",
                     "overrides": args.overrides, "repeats": repeats, "summary": summary,
                     "runs": runs, "plots": [p.name for p in plots],
                     "bench_seconds": time.perf_counter() - t0}, args.out)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
