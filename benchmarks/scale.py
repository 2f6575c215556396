"""Catalog scale: what the next-item loss, a training step, the backtest and scoring cost as the
catalog grows from 10^3 to 10^6 items, clients and events fixed.

    python benchmarks/scale.py                      # both parts: results/scale.json, .png
    python benchmarks/scale.py --only loss --items 1000,100000
    python benchmarks/scale.py --quick --out DIR    # CI's tiny version
    python benchmarks/scale.py --only train --items 1000,1000000 --no-serve --name scale_ab \
        --variant "optim.lazy_rows=false" --variant "optim.lazy_rows=true"   # steps, side by side
    python benchmarks/scale.py --only train --items 1000,1000000 --engines torch,horovod,pair \
        --variant dist.threads_per_rank=1 --no-serve --rounds 3 --features DIR --name scale_phases

Part `loss` (one fresh process per cell, so its peak memory is its own): one next-item loss
forward and backward for a batch of 2,950 targets (a default batch's per rank) from 128 windows
of 50 events, dim 64, with the seen-item exclusion: the dense loss as it was up to 2026-11-27
(full logits, the [targets x items] first-seen mask), the exact loss in item chunks, and the
shared sampled loss. Seconds (median of 3 after one untimed) and peak RSS above the process's
before.
Part `train`: the real feature job (synthetic, cover=1: exactly `items` items) and the real
trainer for a few steps at np=1 and np=2 under each engine with the default config, then the
full-ranking backtest and top-K scoring of every client: seconds per step, rows/s, peak RSS per
rank, gradient bytes a rank exchanges per step (and a dense exchange's), backtest and scoring
seconds and peak RSS, and each run's seconds a step by phase (data, forward, backward, allreduce
wait, optimizer step; under DDP the exchange is inside backward). `--rounds N` runs every cell N
times in turn and reports medians; `--features DIR` keeps the built datasets for the next run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (NO_TRACKING, RESULTS, build_features, env, median,  # noqa: E402
                               save, work_folder)

ITEMS = [1_000, 10_000, 100_000, 1_000_000]
LOSSES = ("dense", "exact", "shared")
DENSE_LIMIT_GB = 12.0  # the dense loss is not tried where its tensors alone would need more


def dense_loss_gb(items: int, targets: int = 2950) -> float:
    """The old dense loss's big tensors: int64 first-seen mask, bool mask, logits, their grad."""
    return targets * items * (8 + 1 + 4 * 3) / 1e9


def probe(loss: str, items: int, repeats: int = 3) -> dict:
    """One cell of part `loss`, in this process."""
    import torch
    import torch.nn.functional as F

    from hvd_ctsm.config import ModelConfig
    from hvd_ctsm.model import catalog
    torch.manual_seed(0)
    torch.set_num_threads(1)
    windows, length, dim = 128, 50, 64
    history = torch.randint(1, items, (windows, length))
    target_row = torch.arange(windows).repeat_interleave(23)[:2950]
    target_pos = torch.randint(0, length, (len(target_row),))
    target = torch.randint(1, items, (len(target_row),))
    table = torch.nn.Parameter(torch.randn(items, dim) * dim**-0.5)
    bias = torch.nn.Parameter(torch.zeros(items))
    states = torch.randn(len(target), dim, requires_grad=True)
    frequency = catalog.TargetFrequency(items)

    def step():
        seen = catalog.seen_pairs(history, target_row, target_pos, items)
        if loss == "exact":
            value = catalog.softmax_cross_entropy(states, target, lambda ids: table[ids], bias,
                                                  seen)
        elif loss == "shared":
            value = catalog.shared_sampled_softmax(states, target, lambda ids: table[ids], bias,
                                                   seen, ModelConfig().shared_negatives,
                                                   frequency.update(target).probability)
        else:  # the dense loss as it was: first-seen positions over the whole catalog
            first = torch.full((windows, items), length, dtype=torch.long)
            first = first.scatter_reduce(1, history, torch.arange(length).expand(windows, -1),
                                         reduce="amin")
            masked = first[target_row] <= target_pos.unsqueeze(1)
            masked[torch.arange(len(target)), target] = False
            logits = (states @ table.T + bias).masked_fill(masked, float("-inf"))
            value = F.cross_entropy(logits, target)
        value.backward()

    before = psutil.Process().memory_info().rss
    step()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"loss": loss, "items": items, "seconds": median(seconds), "all_seconds": seconds,
            "peak_rss_gb_above_start": round((peak - before) / 2**30, 3)}


def loss_part(items: list[int], repeats: int = 3) -> list[dict]:
    cells = []
    for n in items:
        for loss in LOSSES:
            if loss == "dense" and dense_loss_gb(n) > DENSE_LIMIT_GB:
                cells.append({"loss": loss, "items": n, "skipped": f"its tensors need about "
                              f"{dense_loss_gb(n):.0f} GB"})
                continue
            out = subprocess.run([sys.executable, __file__, "probe", "--loss", loss,
                                  "--items", str(n), "--repeats", str(repeats)],
                                 capture_output=True, text=True, env=env(), check=True)
            cells.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"[scale] loss {loss:6s} items {n:>9,}: {cells[-1]}", flush=True)
    return cells


def watch(cmd: list[str], log: Path, timeout: float, checkout: Path | None = None) -> dict:
    """Run `cmd` (its output to `log`), polling the peak RSS of each process in its tree; with
    `checkout`, from that checkout's code (another revision's) instead of this one's."""
    peaks: dict[int, int] = {}
    start = time.perf_counter()
    with open(log, "w") as out:
        # A session of its own: on a timeout its whole tree goes (the launcher's ranks, both
        # trainers of `pair`), not only the launcher or the shell that started them.
        code = {"cwd": checkout, "env": env() | {"PYTHONPATH": str(checkout)}} if checkout \
            else {"env": env()}
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, **code)
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            for p in [root, *root.children(recursive=True)]:
                try:
                    if "python" in p.name():
                        peaks[p.pid] = max(peaks.get(p.pid, 0), p.memory_info().rss)
                except psutil.Error:
                    pass
            if time.perf_counter() - start > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise RuntimeError(f"{cmd[:3]} ran over {timeout} s (log: {log})")
            time.sleep(0.2)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... exited {proc.returncode} (log: {log}):\n"
                           + log.read_text()[-2000:])
    top = sorted(peaks.values(), reverse=True)
    return {"seconds": round(time.perf_counter() - start, 1),
            "peak_rss_gb": [round(v / 2**30, 3) for v in top[:4]]}


def launcher(engine: str, np: int) -> list[str]:
    if np == 1:
        return [sys.executable]
    if engine == "torch":
        return ["torchrun", "--standalone", "--nproc-per-node", str(np), "--no-python",
                sys.executable]
    return ["horovodrun", "-np", str(np), "--gloo", sys.executable]


def train_cell(data: Path, work: Path, engine: str, np: int, steps: int,
               trainer: tuple[str, ...] | list[str] = (), checkout: Path | None = None) -> dict:
    out = work / f"run-{engine}-np{np}"

    def trainer_cmd(launch: list[str], out: Path) -> list[str]:
        return [*launch, "-m", "hvd_ctsm.train", "--data", str(data), "--out", str(out),
                "--overwrite", "--epochs", "1", f"max_steps={steps}", "log_every_steps=1",
                "progress=false", NO_TRACKING, *trainer]

    if engine == "pair":
        # Two one-process runs at once, one thread each, nothing exchanged between them: what
        # np=2 costs on this machine besides its collectives (shared caches, memory bandwidth).
        outs = [out.with_name(f"{out.name}-{side}") for side in "ab"]
        one = [shlex.join(trainer_cmd([sys.executable], o) + ["dist.threads_per_rank=1"])
               for o in outs]
        cmd = ["bash", "-c", f"{one[0]} & a=$!; {one[1]} & b=$!; wait $a; s=$?; wait $b && "
               "exit $s"]
    else:
        outs = [out]
        cmd = trainer_cmd(launcher(engine, np), out)
    watched = watch(cmd, work / f"train-{engine}-np{np}.log", timeout=3600, checkout=checkout)
    timed, summaries = [], [json.loads((o / "train_summary.json").read_text()) for o in outs]
    for o in outs:
        steps_log = [json.loads(line) for line in (o / "train_log.jsonl").read_text()
                     .splitlines()]
        timed += steps_log[2:] or steps_log  # the first steps open readers and warm up
    return {"engine": engine, "np": np, "seconds_per_step": median(
        [s["time/step_seconds"] for s in timed]), "phase_seconds": phase_seconds(timed),
        "rows_per_s": median(
        [s["samples_per_s"] for s in timed]), "exchange_mb": median(
        [s["exchange/mb"] for s in timed]), "dense_exchange_mb": timed[0]["exchange/dense_mb"],
        "peak_rss_gb_by_rank": watched["peak_rss_gb"][:np], "wall_seconds": watched["seconds"],
        "parameter_checksums": [summary["parameter_checksums"][0] for summary in summaries],
        "ranks_in_sync": all(len(set(summary["parameter_checksums"])) == 1
                             for summary in summaries),
        "loss_log": [line for line in (work / f"train-{engine}-np{np}.log").read_text()
                     .splitlines() if "next-item loss" in line][:1]}


def phase_seconds(timed: list[dict]) -> dict[str, float]:
    """Seconds a step in each phase of the trainer's step timer, median over the logged steps
    (each the ranks' mean, as the trainer logs it). Under DDP the gradient exchange and any wait
    for the other rank are inside "backward"."""
    return {key.split("/", 1)[1]: median([s["time/step_seconds"] * s[key] for s in timed])
            for key in timed[0] if key.startswith("time_share/")}


def repeated(rounds: list[dict]) -> dict:
    """One cell run `len(rounds)` times in turn: its medians, and each round's step time."""
    last = dict(rounds[-1])
    if len(rounds) > 1:
        last["seconds_per_step"] = median([r["seconds_per_step"] for r in rounds])
        last["rows_per_s"] = median([r["rows_per_s"] for r in rounds])
        last["phase_seconds"] = {k: median([r["phase_seconds"][k] for r in rounds])
                                 for k in last["phase_seconds"]}
        last["round_seconds_per_step"] = [r["seconds_per_step"] for r in rounds]
    return last


def serve_cells(data: Path, work: Path, model: Path) -> dict:
    backtest = watch([sys.executable, "-m", "hvd_ctsm", "backtest", "--data", str(data),
                      "--model", str(model), "--report", str(work / "report.json")],
                     work / "backtest.log", timeout=7200)
    score = watch([sys.executable, "-m", "hvd_ctsm", "score", "--data", str(data), "--model",
                   str(model), "--out", str(work / "scores.parquet"), "--k", "10"],
                  work / "score.log", timeout=7200)
    return {"backtest": backtest, "score": score}


def train_part(items: list[int], clients: int, events: int, steps: int, engines: list[str],
               work: Path, row_groups: int = 64, serve: bool = True,
               variants: tuple[str, ...] = ("",), rounds: int = 1,
               features: Path | None = None) -> list[dict]:
    cells = []
    for n in items:
        source = f"synthetic:clients={clients},items={n},events={events},seed=7,cover=1"
        data = (features or work) / f"data-{n}"
        start = time.perf_counter()
        build_features(source, data, work / f"features-{n}.log", max_len=50, row_groups=row_groups)
        meta = json.loads((data / "metadata.json").read_text())
        if meta["source"] != source:  # a dataset kept in --features by another run's sizes
            raise SystemExit(f"scale: {data} was built from {meta['source']}, not {source}: "
                             "give another --features folder")
        cell = {"items": n, "vocab_items": meta["vocab"]["items"], "clients": clients,
                "events": events, "features_seconds": round(time.perf_counter() - start, 1),
                "runs": []}
        runs: dict[tuple, list[dict]] = {}
        for _ in range(rounds):  # every cell in turn, round after round: the same moments
            for engine, np in [("single", 1)] + [(e, 2) for e in engines]:
                for variant in variants:
                    run = train_cell(data, work, engine, np, steps, variant.split())
                    runs.setdefault((engine, np, variant), []).append(run)
                    print(f"[scale] train items {n:>9,} {engine} np={np} {variant}: {run}",
                          flush=True)
        cell["runs"] = [repeated(r) | ({"variant": key[2]} if key[2] else {})
                        for key, r in runs.items()]
        if serve:
            cell |= serve_cells(data, work, work / f"run-{engines[0]}-np2")
            print(f"[scale] serve items {n:>9,}: backtest {cell['backtest']}, "
                  f"score {cell['score']}", flush=True)
        cells.append(cell)
    return cells


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", nargs="?", default="all", choices=("all", "probe"))
    p.add_argument("--only", choices=("loss", "train"))
    p.add_argument("--loss", choices=LOSSES, help="probe: the loss")
    p.add_argument("--items", default=",".join(map(str, ITEMS)))
    p.add_argument("--clients", type=int, default=20_000)
    p.add_argument("--events", type=int, default=2_000_000)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3, help="part loss: timed repeats per cell")
    p.add_argument("--engines", default="torch,horovod",
                   help="part train, besides one process: torch, horovod (np=2 each) and pair "
                        "(two one-process runs at once, one thread each, no collectives)")
    p.add_argument("--quick", action="store_true", help="tiny sizes (CI)")
    p.add_argument("--no-serve", dest="serve", action="store_false",
                   help="part train: no backtest or scoring, the training steps alone")
    p.add_argument("--variant", action="append", default=None, metavar="OVERRIDES",
                   help="part train: space-separated trainer overrides, each run once per "
                        "variant (repeatable; default: the default config)")
    p.add_argument("--rounds", type=int, default=1,
                   help="part train: run every cell this many times in turn; medians reported")
    p.add_argument("--features", type=Path, default=None,
                   help="part train: build the datasets here and reuse those already built "
                        "(default: a temporary folder)")
    p.add_argument("--name", default=None, help="results NAME.json, .png (default: scale)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    items = [int(x) for x in args.items.split(",")]
    if args.part == "probe":
        print(json.dumps(probe(args.loss, items[0], args.repeats)))
        return 0
    if args.quick:
        items, args.clients, args.events, args.steps = [4000], 300, 9000, 3
    payload: dict = {"sizes": {"items": items, "clients": args.clients, "events": args.events,
                               "steps": args.steps, "rounds": args.rounds},
                     "variants": args.variant or [""]}
    if args.only in (None, "loss"):
        payload["loss"] = loss_part(items, args.repeats)
    if args.only in (None, "train"):
        with work_folder("hvd_ctsm-scale-") as work:
            payload["train"] = train_part(items, args.clients, args.events, args.steps,
                                          args.engines.split(","), work,
                                          row_groups=8 if args.quick else 64,
                                          serve=args.serve, variants=tuple(args.variant or [""]),
                                          rounds=args.rounds, features=args.features)
    name = args.name or ("scale_quick" if args.quick else "scale")
    path = save(name, payload, args.out)
    plot(payload, args.out / f"{name}.png")
    print(f"[scale] wrote {path}")
    return 0


def gb(values: list[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def run_name(run: dict) -> str:
    return " ".join([f"{run['engine']} np={run['np']}", run.get("variant", "")]).strip()


def rounds_note(rounds: int) -> str:
    """How a cell's seconds a step were summarized, for the table's caption."""
    return f"; each cell the median of {rounds} rounds, run in turn" if rounds > 1 else ""


def render(p: dict) -> list[str]:
    """RESULTS.md's "Catalog scale" section (benchmarks/report.py)."""
    out = [f"Measured in parts: {'; '.join(f'{k}: {v}' for k, v in p['runs'].items())}.", ""
           ] if "runs" in p else []
    out += ["The next-item loss alone (forward and backward, 2,950 targets, seen items excluded; "
           "seconds, median of 3; peak RSS above the process's start, GB):", "",
           "| items | dense (before) | exact in chunks | shared, log-Q |",
           "| ---: | ---: | ---: | ---: |"]
    by_size: dict[int, dict] = {}
    for cell in p.get("loss", []):
        measured = "skipped" not in cell and (
            f"{cell['seconds']:.2f} s, {cell['peak_rss_gb_above_start']:.2f}")
        by_size.setdefault(cell["items"], {})[cell["loss"]] = measured or cell["skipped"]
    for items, cells in by_size.items():
        out.append(f"| {items:,} | " + " | ".join(cells.get(k, "") for k in LOSSES) + " |")
    sizes = p["sizes"]
    out += ["", f"Training with the default config ({sizes['clients']:,} clients, "
            f"{sizes['events']:,} events, synthetic cover=1; {sizes['steps']} steps, the first "
            f"two untimed{rounds_note(sizes.get('rounds', 1))}), then the full-ranking backtest "
            "and top-10 scoring of every client:", "",
            "| items | run | s/step | rows/s | peak RSS per rank, GB | exchange MB/step "
            "(dense) |", "| ---: | --- | ---: | ---: | ---: | ---: |"]
    for cell in p.get("train", []):
        for r in cell["runs"]:
            out.append(f"| {cell['items']:,} | {run_name(r)} | "
                       f"{r['seconds_per_step']:.2f} | {r['rows_per_s']:.0f} | "
                       f"{gb(r['peak_rss_gb_by_rank'])} | {r['exchange_mb']:.1f} "
                       f"({r['dense_exchange_mb']:.1f}) |")
    out += ["", "| items | feature job s | backtest s, peak GB | score s, peak GB |",
            "| ---: | ---: | ---: | ---: |"]
    for cell in (c for c in p.get("train", []) if "backtest" in c):
        out.append(f"| {cell['items']:,} | {cell['features_seconds']:.0f} | "
                   f"{cell['backtest']['seconds']:.0f}, {max(cell['backtest']['peak_rss_gb']):.2f}"
                   f" | {cell['score']['seconds']:.0f}, {max(cell['score']['peak_rss_gb']):.2f} |")
    return out + ["", "![catalog scale](results/scale.png)", ""]


def plot(p: dict, path: Path) -> None:
    from benchmarks.common import pyplot

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for loss in LOSSES:
        cells = [c for c in p.get("loss", []) if c["loss"] == loss and "seconds" in c]
        left.plot([c["items"] for c in cells], [c["seconds"] for c in cells], "o-", label=loss)
    left.set(xlabel="items", ylabel="loss fwd+bwd, s", title="next-item loss, 2,950 targets")
    if p.get("loss"):
        left.set(xscale="log", yscale="log")
    runs: dict[str, list] = {}
    for cell in p.get("train", []):
        for r in cell["runs"]:
            runs.setdefault(run_name(r), []).append(
                (cell["items"], r["seconds_per_step"]))
    for name, points in runs.items():
        right.plot(*zip(*points, strict=True), "o-", label=name)
    right.set(xlabel="items", ylabel="s / step", title="training step (default)")
    if runs:
        right.set(xscale="log")
    for ax in (left, right):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
