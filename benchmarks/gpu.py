"""The GPU check: CUDA step time and memory by catalog size, loss and AMP mode, and the ML-100K
default trained on one GPU under bf16 and fp32, in one run of under 8 minutes.

    scripts/gpu_check.sh FEATURES OUT     # FEATURES: ML-100K as the feature job writes it

It needs only what a GPU image with PyTorch has (torch, numpy, pyarrow, PyYAML): the repository
on PYTHONPATH, no Spark, Petastorm or Horovod (the dataset is read by hvd_ctsm.data.arrow_reader,
the
trainer runs under torchrun). Every part runs in its own time box and writes what it measured to
OUT/gpu.json as it goes, so a part that fails or runs out of time leaves the others' results.

- steps: the CTSM training step (forward, backward, AdamW) on real ML-100K batches, with the item
  vocabulary enlarged to 10^3..10^6 (the extra items never occur as targets; the shared loss
  draws them as negatives, the exact loss scores them all): seconds a step after warm-up (CUDA
  synchronised), targets a second, peak GPU memory; loss auto (exact up to 25,000 items, shared
  above) and exact; AMP off, bf16 and fp16; item tables with dense AdamW, and where the loss is
  shared also as the trainer runs them by default (sparse gradients, rows caught up); and some
  cells again with the losses' blocks of rows 64x larger (BIG_BLOCK: fewer kernel launches).
- parity: the catalog-scale code gives its unit tests' answers on the device
  (benchmarks/gpu_parity.py: exact_exp, the lazy rows' catch-up, the blocked exact loss, the
  chunked top-k).
- ml100k: `torchrun --nproc-per-node 1 -m hvd_ctsm.train` with the default config and the
  backtest of the model it keeps, with amp=bf16 and amp=off alternating seed by seed (`--seeds`):
  test NDCG@10 (full and sampled), epochs, seconds; and (`--shared-run`) one run with
  model.loss=shared, the route of a large catalog (sparse item gradients, lazy rows) end to end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import gpu_parity  # noqa: E402
from benchmarks.common import REPO, machine  # noqa: E402

ITEMS = (1_000, 10_000, 100_000, 1_000_000)
AMPS = ("off", "bf16", "fp16")
ROWS = {"dense": "dense, AdamW", "lazy": "sparse, caught up"}  # step_cell's `rows`
BIG_BLOCK = 2**26  # logits a block of rows may hold in the block cells: 256 MB of float32


def gpu_info() -> dict:
    import numpy
    import pyarrow
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "numpy": numpy.__version__,
            "pyarrow": pyarrow.__version__, "gpu": None}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                 "bf16": torch.cuda.is_bf16_supported()}
    return info


class Results:
    """OUT/gpu.json, rewritten after every cell."""

    def __init__(self, path: Path):
        self.path, self.payload = path, {"machine": machine(), "gpu": gpu_info(), "parity": [],
                                         "steps": [], "ml100k": []}
        self.save()

    def add(self, part: str, row: dict) -> None:
        self.payload[part].append(row)
        print(json.dumps({part: row}), flush=True)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.payload, indent=1))
        tmp.replace(self.path)


def preload(data: Path, batches: int, device) -> tuple[list[dict], object]:
    from hvd_ctsm.config import load_config
    from hvd_ctsm.data.batches import plan_epoch, train_batches
    from hvd_ctsm.data.dataset import Dataset

    cfg, dataset = load_config(), Dataset.open(data)
    url, meta = dataset.split("train"), dataset.meta
    plan = plan_epoch(url, 1, cfg.data.batch_size)
    plan = replace(plan, steps=min(batches, plan.steps))  # a small dataset: the batches it has
    rows = train_batches(url, 0, 1, 0, plan, cfg.data.batch_size, meta.max_len, seed=0)
    return [{k: v.to(device) for k, v in b.items()} for b in rows], dataset


def step_cell(batches: list[dict], dataset, items: int, loss: str, amp: str, steps: int,
              warmup: int, device, rows: str = "dense", block_logits: int | None = None) -> dict:
    """One model at one catalog size: median seconds a step, targets/s, peak GPU memory.
    rows "dense": AdamW over dense item gradients; "lazy": the trainer's default with the
    shared loss, sparse item gradients and the optimizer on the rows a step reads, caught up
    (hvd_ctsm.train.lazy_rows), and every row settled after the last step. block_logits: the
    losses' rows-in-blocks size (catalog.BLOCK_LOGITS, sized for a CPU's cache) for this cell."""
    import torch

    from hvd_ctsm.config import load_config
    from hvd_ctsm.model import catalog
    from hvd_ctsm.model.ctsm import CTSM
    from hvd_ctsm.model.heads import resolve_loss
    from hvd_ctsm.train import lazy_rows
    from hvd_ctsm.train.support import autocast_for, build_model_sizes

    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cfg = load_config(None, [f"model.loss={loss}"])
    sizes = build_model_sizes(dataset)  # the data's own items, or more (never occurring ones)
    sizes = replace(sizes, num_items=max(items, sizes.num_items))
    row = {"items": sizes.num_items, "loss": resolve_loss(loss, sizes.num_items + 1), "amp": amp,
           "rows": rows} | ({"block_logits": block_logits} if block_logits else {})
    default_block = catalog.BLOCK_LOGITS
    catalog.BLOCK_LOGITS = block_logits or default_block
    torch.manual_seed(0)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = optimizer = None
    try:
        model = CTSM(sizes, cfg.model).to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        lazy = None
        if rows == "lazy":
            model.encoder.use_sparse_gradients()
            tables = [m for m in model.modules() if isinstance(m, torch.nn.Embedding) and m.sparse]
            lazy = lazy_rows.LazyRows(optimizer, tables)
        autocast, scaler = autocast_for(amp, device)
        times, losses = [], []
        for i in range(warmup + steps):
            batch = batches[i % len(batches)]
            sync()
            t0 = time.perf_counter()
            with autocast():
                value = sum(model(batch).values())
            scaler.scale(value).backward()
            scaler.unscale_(optimizer)
            taken = lazy_rows.take_row_gradients([t.weight for t in tables]) if lazy else {}
            lazy_rows.scaled_step(scaler, optimizer, lazy, taken)  # the trainer's own
            optimizer.zero_grad(set_to_none=True)
            sync()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
                losses.append(value.item())
        if lazy:  # every row brought up to the last step, as before a validation
            lazy.settle()
            row["settled_finite"] = bool(torch.isfinite(model.encoder.item.weight).all())
            row |= recommend_cell(model, batches[0], sync)
        step = statistics.median(times)
        targets = statistics.mean(len(b["target_item"]) for b in batches)
        row |= {"s_per_step": round(step, 5), "targets_per_s": round(targets / step),
                "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None,
                "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
                "finite": all(map(lambda x: x == x and abs(x) != float("inf"), losses))}
    except torch.OutOfMemoryError as exc:
        row |= {"error": f"out of memory: {str(exc).splitlines()[0]}"}
    finally:
        catalog.BLOCK_LOGITS = default_block
        del model, optimizer
        if cuda:
            torch.cuda.empty_cache()
    return row


def recommend_cell(model, batch: dict, sync) -> dict:
    """Each of a batch's targets' top-10 over the whole catalog, its history's items left out
    (CTSM.recommend: item chunks with a running merge, on the model's device): the seconds it
    took and whether every target got 10 finite scores."""
    import torch

    model.eval()
    with torch.no_grad():
        states = model.states_at(batch)
        seen = batch["item"][batch["target_row"]].cpu().tolist()
        sync()
        t0 = time.perf_counter()
        values, items = model.recommend(states, 10, seen)
        sync()
    model.train()
    return {"recommend_s": round(time.perf_counter() - t0, 4),
            "recommend_ok": items.shape == (len(states), 10)
            and bool(torch.isfinite(values).all())}


def steps_part(data: Path, results: Results, budget: float, steps: int, warmup: int,
               device, items: tuple[int, ...]) -> None:
    start = time.monotonic()
    batches, dataset = preload(data, 8, device)
    cells = [(n, "auto", amp, "dense", None) for n in items for amp in AMPS]
    # The trainer's default path where the loss is shared (the dry run's largest catalog
    # stands in for it there), before the slow exact loss at those sizes.
    lazy_items = [n for n in items if n > 25_000] or list(items[-1:])
    cells += [(n, "shared", amp, "lazy", None) for n in lazy_items for amp in ("bf16", "off")]
    # The losses' blocks of rows hold 4 MB of logits, for a CPU's cache; on a GPU each block is
    # a dozen kernel launches (about 50 blocks a step at 10^4 items): the same cells with 64x.
    cells += [(n, "auto", "bf16", "dense", BIG_BLOCK) for n in items if n >= 10_000]
    cells += [(n, "shared", "bf16", "lazy", BIG_BLOCK) for n in lazy_items]
    cells += [(n, "full", "bf16", "dense", None) for n in items if n > 25_000]
    for items, loss, amp, rows, block in cells:
        if time.monotonic() - start > budget:
            results.add("steps", {"items": items, "loss": loss, "amp": amp, "rows": rows,
                                  "error": f"skipped: the part's {budget:.0f} s were spent"})
            continue
        results.add("steps", step_cell(batches, dataset, items, loss, amp, steps, warmup, device,
                                       rows, block))


def ml100k_run(data: Path, out: Path, work: Path, amp: str, seed: int, timeout: float,
               extra: list[str], loss: str = "auto") -> dict:
    """The default config (but `loss`) on one GPU under torchrun, then the backtest of the kept
    model: the run folder and report in `work`, the log in `out`."""
    name = f"ml100k-{amp}-seed{seed}" + ("" if loss == "auto" else f"-{loss}")
    run, log = work / name, out / f"{name}.log"
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = os.environ | {"PYTHONPATH": path, "PYTHONWARNINGS": "ignore"}
    train = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
             "1", "-m", "hvd_ctsm.train", "--data", str(data), "--out", str(run), "--overwrite",
             f"amp={amp}", f"seed={seed}", f"model.loss={loss}", "dist.backend=torch",
             "tracking.enabled=false", *extra]
    report = work / f"{name}-report.json"
    backtest = [sys.executable, "-m", "hvd_ctsm", "backtest", "--data", str(data), "--model",
                str(run), "--report", str(report)]
    row = {"amp": amp, "seed": seed, "loss": loss}
    t0 = time.monotonic()
    with open(log, "w") as sink:
        for name, cmd in (("train", train), ("backtest", backtest)):
            started = time.monotonic()
            try:
                code = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                      cwd=REPO, timeout=max(timeout - (started - t0), 1)
                                      ).returncode
            except subprocess.TimeoutExpired:
                return row | {"error": f"{name} ran past the part's {timeout:.0f} s"}
            row[f"{name}_s"] = round(time.monotonic() - started, 1)
            if code != 0:
                return row | {"error": f"{name} exited {code} (see {log.name})"}
    metrics = json.loads(report.read_text())
    for who in ("model", "popularity"):
        row[who] = {f"{protocol}.{k}": round(metrics[who][protocol][k], 4)
                    for protocol in ("full", "sampled") for k in ("ndcg@10", "hr@10")}
    lines = [line.split("hvd_ctsm.train: ", 1)[-1] for line in log.read_text().splitlines()
             if "hvd_ctsm.train: " in line]
    row["log"] = [line for line in lines if line.startswith(("backend=", "early stop", "done",
                                                             "next-item loss"))]
    row["log"] += [line for line in lines if " val full " in line][-1:]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="ML-100K from the feature job")
    p.add_argument("--out", type=Path, required=True, help="where gpu.json and logs go")
    p.add_argument("--work", type=Path, default=None,
                   help="where the ML-100K runs' folders go (default: OUT/runs)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps-budget", type=float, default=120.0, help="seconds for the step part")
    p.add_argument("--ml100k-budget", type=float, default=150.0, help="seconds for each run")
    p.add_argument("--parts", default="parity,steps,ml100k")
    p.add_argument("--amps", default="bf16,off", help="AMP modes of the ML-100K runs")
    p.add_argument("--seeds", default="0", help="seeds of the ML-100K runs, e.g. 0,1,2")
    p.add_argument("--shared-run", action=argparse.BooleanOptionalAction, default=True,
                   help="also an ML-100K run with model.loss=shared (bf16, the first seed)")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="check the script itself on a machine without a GPU: small catalogs, "
                        "2 steps, one epoch (its numbers mean nothing)")
    args = p.parse_args(argv)
    import torch

    items, extra = ITEMS, []
    if args.cpu_dry_run:
        device, items, extra = torch.device("cpu"), ITEMS[:2], ["epochs=1"]
        args.steps, args.warmup = 2, 1
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        print("gpu check: no CUDA device here; run it on a machine with a GPU "
              "(--cpu-dry-run checks the script)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or args.out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    results = Results(args.out / "gpu.json")
    print(json.dumps(results.payload["gpu"]), flush=True)
    parts = args.parts.split(",")
    if "parity" in parts:
        gpu_parity.run(device, lambda row: results.add("parity", row))
    if "steps" in parts:
        steps_part(args.data, results, args.steps_budget, args.steps, args.warmup, device, items)
    if "ml100k" in parts:
        for seed in map(int, args.seeds.split(",")):  # alternating modes, seed by seed
            for amp in filter(None, args.amps.split(",")):  # "": none, the shared run alone
                results.add("ml100k", ml100k_run(args.data, args.out, work, amp, seed,
                                                 args.ml100k_budget, extra))
        if args.shared_run:
            seed = int(args.seeds.split(",")[0])
            results.add("ml100k", ml100k_run(args.data, args.out, work, "bf16", seed,
                                             args.ml100k_budget, extra, loss="shared"))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def render(p: dict) -> list[str]:
    """The GPU section of benchmarks/RESULTS.md."""
    g = p["gpu"]
    out = [f"{g['gpu']} ({g['gpu_memory_gib']} GiB), torch {g['torch']} (CUDA {g['cuda']}), "
           f"numpy {g['numpy']}, pyarrow {g['pyarrow']}: a current stack with no Spark, Petastorm "
           "or Horovod installed (`scripts/gpu_check.sh`). " + p.get("note", ""), "",
           "**Training step by catalog size** (real ML-100K batches of 64 rows, about 5,200 "
           "targets; the vocabulary enlarged, one GPU; median of the timed steps):", "",
           "| items | loss | AMP | item rows | s/step | targets/s | peak GPU GiB | top-10 s |",
           "| ---: | --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in p["steps"]:
        rows = ROWS[r.get("rows", "dense")]  # results before 2026-11-28: dense
        loss = r["loss"] + (f", blocks of 2^{r['block_logits'].bit_length() - 1}"
                            if r.get("block_logits") else "")  # since 2026-11-30
        if "error" in r:
            out.append(f"| {r['items']:,} | {loss} | {r['amp']} | {rows} | {r['error']} "
                       "| | | |")
        else:
            peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"  # None: a CPU
            # the lazy rows' cells since 2026-11-29: a batch's top-10 (CTSM.recommend)
            top = f"{r['recommend_s']:.3f}" if "recommend_s" in r else "-"
            out.append(f"| {r['items']:,} | {loss} | {r['amp']} | {rows} | "
                       f"{r['s_per_step']:.4f} | {r['targets_per_s']:,} | {peak} | {top} |")
    if p.get("parity"):  # since 2026-11-30
        out += ["", "**Parity**: the catalog-scale code's unit-test properties on the device "
                "(`benchmarks/gpu_parity.py`):", "", "| check | device | result | detail |",
                "| --- | --- | --- | --- |"]
        for r in p["parity"]:
            detail = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                               for k, v in r.items() if k not in ("check", "device", "ok"))
            out.append(f"| {r['check']} | {r['device']} | {'pass' if r['ok'] else 'FAIL'} | "
                       f"{detail} |")
    out += ["", "**ML-100K, the default config on one GPU** (`torchrun --nproc-per-node 1`, "
            "strict ties, effective batch 64, test split; seconds include torchrun's start):", "",
            "| AMP | loss | seed | full NDCG@10 | full HR@10 | sampled NDCG@10 | epochs "
            "| train s |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in sorted(p["ml100k"], key=lambda r: (r["amp"], r.get("loss", "auto"), r["seed"])):
        loss = r.get("loss", "auto")  # before 2026-11-30: auto
        if "error" in r:
            out.append(f"| {r['amp']} | {loss} | {r['seed']} | {r['error']} | | | | |")
            continue
        m = r["model"]
        epochs = next((line.split()[4].rstrip(":") for line in r["log"]
                       if line.startswith("early stop")), "100")
        out.append(f"| {r['amp']} | {loss} | {r['seed']} | {m['full.ndcg@10']:.4f} | "
                   f"{m['full.hr@10']:.4f} | {m['sampled.ndcg@10']:.4f} | {epochs} | "
                   f"{r['train_s']:.0f} |")
    return out + [""]
