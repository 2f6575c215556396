"""Horovod against PyTorch DDP, and Horovod's knobs, on the CTSM step at np=2 (Gloo, CPU).

    python benchmarks/comm.py --data FEATURES            # 3 repeats of everything
    python benchmarks/comm.py --data FEATURES --quick    # one short pass, a smoke test

Peer: `horovodrun -np 2 benchmarks/step_worker.py --backend horovod` (the trainer's default knobs
for CPU), `torchrun --nproc-per-node 2 ... --backend ddp` and two independent `--backend local`
workers side by side (each on one rank's batches, no communication: the machine's own limit),
launched in turn, same model, same batches; the figures are ratios of samples/s, repeat by repeat.
Knobs: one horovodrun launch per variant, all variants in turn per repeat: fp16 compression
on/off, fusion threshold 0/1/8/64/128 MB, cycle time, backward_passes_per_step 1/2/4, threads,
core affinity and Horovod's spinning wait; each variant changes one knob from the trainer's CPU
defaults. On the default model and (the knobs that act on the wire) on a communication-heavy one:
a 200k-item vocabulary, ~25M parameters, ~100 MB of gradients a step.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, env, horovodrun, run, save, spread, work_folder  # noqa: E402
from hvd_ctsm.config import DistConfig  # noqa: E402

WORKER = str(Path(__file__).resolve().parent / "step_worker.py")
MODELS = {"default": ["--dim", "64", "--layers", "2"],
          "heavy": ["--dim", "128", "--layers", "2", "--items", "200000", "--loss", "sampled"]}
STEPS_SHARE = {"default": 1.0, "heavy": 0.3}  # heavy steps are slow: fewer of them


def cpu_defaults() -> dict:
    """The trainer's defaults for CPU runs, as knobs for the worker."""
    d = DistConfig()
    return {"cycle_ms": d.cycle_time_ms, "fusion_mb": d.fusion_threshold_mb,
            "sleeping_wait": d.sleeping_wait}


def knob_variants(model: str, quick: bool) -> dict[str, dict]:
    """Named variants; each changes one knob from the CPU defaults (duplicates dropped)."""
    base = cpu_defaults()
    variants = {"defaults": base, "fp16": base | {"compression": "fp16"}}
    if quick:
        return variants
    variants |= {f"fusion_{mb}MB": base | {"fusion_mb": mb} for mb in (0, 1, 8, 64, 128)}
    variants |= {"bpps_2": base | {"bpps": 2}}
    if model == "default":
        # 20 ms is the CPU default ("defaults"); 1 ms is Horovod's own default.
        variants |= {f"cycle_{ms}ms": base | {"cycle_ms": ms} for ms in (1, 5, 10, 50)}
        variants |= {"bpps_4": base | {"bpps": 4}, "threads_2": base | {"threads": 2},
                     "affinity": base | {"affinity": True},
                     "spin_wait": base | {"sleeping_wait": False}}
    unique, seen = {}, []
    for name, knobs in variants.items():
        if knobs not in seen:
            unique[name] = knobs
            seen.append(knobs)
    return unique


def worker_cmd(backend: str, data: Path, out: Path, model: str, steps: int, extra=()) -> list:
    steps = max(3, round(steps * STEPS_SHARE[model]))
    return ["--backend", backend, "--data", str(data), "--json", str(out), "--steps", str(steps),
            "--warmup", str(min(5, steps)), *MODELS[model], *extra]


def local_pair(data: Path, work: Path, steps: int, rep: int) -> dict:
    """Two single-rank workers at once, on rank 0's and rank 1's batches: samples/s of both."""
    procs = []
    for rank in range(2):
        out = work / f"peer-pair{rank}-{rep}.json"
        log = open(out.with_suffix(".log"), "w")  # noqa: SIM115  closed when the process ends
        cmd = [sys.executable, WORKER, *worker_cmd("local", data, out, "default", steps,
                                                   ["--shard", f"{rank}/2"])]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env()),
                      log, out))
    results = []
    for proc, log, out in procs:
        code = proc.wait(timeout=900)
        log.close()
        if code != 0:
            raise RuntimeError(f"a paired worker exited {code}: see {log.name}")
        results.append(json.loads(out.read_text()))
    return {"samples_per_s": sum(r["samples_per_s"] for r in results),
            "per_worker": [r["per_rank"][0] for r in results]}


def launch(backend: str, data: Path, work: Path, steps: int, rep: int) -> dict:
    out = work / f"peer-{backend}-{rep}.json"
    if backend == "pair":
        return local_pair(data, work, steps, rep)
    if backend == "horovod":
        cmd = horovodrun(2, [WORKER, *worker_cmd(
            backend, data, out, "default", steps, ["--knobs", json.dumps(cpu_defaults())])])
    else:
        # --standalone: a free port; without it torchrun takes the fixed 29500, which anything
        # else on the machine may hold.
        cmd = [str(Path(sys.executable).parent / "torchrun"), "--standalone",
               "--nproc-per-node", "2", WORKER, *worker_cmd(backend, data, out, "default", steps)]
    run(cmd, out.with_suffix(".log"))
    return json.loads(out.read_text())


def peer(data: Path, work: Path, repeats: int, steps: int) -> dict:
    """Horovod, DDP and the independent pair launched in turn; ratios per repeat."""
    runs = {"horovod": [], "ddp": [], "pair": []}
    for rep in range(repeats):
        for backend in runs:
            runs[backend].append(launch(backend, data, work, steps, rep))
            print(f"[comm] peer {backend} repeat {rep + 1}: "
                  f"{runs[backend][-1]['samples_per_s']:.0f} samples/s", flush=True)

    def ratio(a: str, b: str) -> dict:
        return spread(x["samples_per_s"] / y["samples_per_s"]
                      for x, y in zip(runs[a], runs[b], strict=True))

    return {f"{k}_samples_per_s": spread(r["samples_per_s"] for r in rs)
            for k, rs in runs.items()} | {
        "horovod_over_ddp": ratio("horovod", "ddp"),
        "horovod_over_pair": ratio("horovod", "pair"),
        "ddp_over_pair": ratio("ddp", "pair"), "runs": runs}


def knobs(data: Path, work: Path, repeats: int, steps: int, quick: bool) -> dict:
    out = {}
    for model in ("default",) if quick else ("default", "heavy"):
        variants = knob_variants(model, quick)
        per_variant = {name: [] for name in variants}
        for rep in range(repeats):
            for name, setting in variants.items():
                path = work / f"knobs-{model}-{name}-{rep}.json"
                run(horovodrun(2, [WORKER, *worker_cmd("horovod", data, path, model, steps,
                                                       ["--knobs", json.dumps(setting)])]),
                    path.with_suffix(".log"))
                per_variant[name].append(json.loads(path.read_text()))
            print(f"[comm] knobs {model} repeat {rep + 1}/{repeats} done", flush=True)
        base = per_variant["defaults"]
        out[model] = {"parameters": base[0]["parameters"], "variants": {
            name: {"knobs": rs[0]["knobs"],
                   "gradient_bytes_per_step": rs[0]["gradient_bytes_per_step"],
                   "samples_per_s": spread(r["samples_per_s"] for r in rs),
                   "vs_defaults": spread(r["samples_per_s"] / b["samples_per_s"]
                                         for r, b in zip(rs, base, strict=True)),
                   "step_median_s": spread(r["step_median_s"] for r in rs),
                   "wait_share": spread(r["wait_share"] for r in rs),
                   "wait_cpu_share": spread(r["wait_cpu_share"] for r in rs),
                   "other_threads_cores": spread(r["other_threads_cores"] for r in rs)}
            for name, rs in per_variant.items()}}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, type=Path, help="feature job output folder")
    p.add_argument("--repeats", type=int, default=3, help="Horovod/DDP pairs")
    p.add_argument("--knob-repeats", type=int, default=2, help="passes over the knob variants")
    p.add_argument("--steps", type=int, default=30, help="timed steps per variant")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    repeats, steps = (1, 6) if args.quick else (args.repeats, args.steps)
    knob_repeats = 1 if args.quick else args.knob_repeats
    t0 = time.perf_counter()
    with work_folder(prefix="bench-comm-") as tmp:
        result = {"peer": peer(args.data, Path(tmp), repeats, steps),
                  "knobs": knobs(args.data, Path(tmp), knob_repeats, steps, args.quick)}
    save("comm", {"data": args.data.name, "repeats": repeats, "knob_repeats": knob_repeats,
                  "steps": steps,
                  "cpu_defaults": cpu_defaults(), **result,
                  "bench_seconds": time.perf_counter() - t0}, args.out)
    print(json.dumps(result["peer"]["horovod_over_ddp"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
