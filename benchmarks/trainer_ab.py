"""Trainer settings side by side: the real trainer under horovodrun, variants alternated.

    python benchmarks/trainer_ab.py --data FEATURES --config ml100k --np 2 --epochs 3 \\
        --name read_ahead --variant "data.read_ahead_steps=0" --variant "data.read_ahead_steps=4"
    python benchmarks/trainer_ab.py ... --backend torch    # under torchrun instead of horovodrun

Each repeat runs every variant once, in turn (A B, A B, ...), so that they share the machine's
moments. Per run, from the trainer's own log (one record per epoch): epoch seconds (sum of step
times), the allreduce and data shares per epoch; per launch, the CPU seconds its processes spent
in user code and in the kernel (start-up and validation included). Writes results/ab_NAME.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.backends import torchrun  # noqa: E402
from benchmarks.common import RESULTS, horovodrun, run, save, spread, work_folder  # noqa: E402
from benchmarks.scaling import read_train_log, trainer_args  # noqa: E402


def steps_per_epoch(data: Path, config: str | None, ranks: int) -> int:
    from hvd_ctsm.config import load_config
    from hvd_ctsm.data.batches import plan_epoch, split_url

    cfg = load_config(config)
    rows = cfg.data.batch_size * cfg.dist.backward_passes_per_step
    return plan_epoch(split_url(data, "train"), ranks, rows).steps


def one_run(args, variant: str, work: Path) -> dict:
    out = work / "run"
    overrides = [f"epochs={args.epochs}", f"log_every_steps={args.log_every}", *variant.split()]
    launch = torchrun if args.backend == "torch" else horovodrun
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run(launch(args.np, trainer_args(args.data, out, args.config,
                                     [*overrides, f"dist.backend={args.backend}"])),
        work / "run.log")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the launch's processes, all waited for
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return read_train_log(out) | {
        "data_share_by_record": [r.get("time_share/data", 0.0) for r in records],
        "allreduce_share_by_record": [r.get("time_share/allreduce", 0.0) for r in records],
        "cpu_user_seconds": user, "cpu_kernel_seconds": system}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, type=Path)
    p.add_argument("--config", default=None)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--backend", choices=("horovod", "torch"), default="horovod")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--variant", action="append", required=True,
                   help="space-separated trainer overrides; give two or more")
    p.add_argument("--name", required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    args.log_every = steps_per_epoch(args.data, args.config, args.np)  # one record per epoch
    t0, runs = time.perf_counter(), {v: [] for v in args.variant}
    for rep in range(args.repeats):
        for variant in args.variant:
            with work_folder(prefix="bench-ab-") as tmp:
                runs[variant].append(one_run(args, variant, Path(tmp)))
            print(f"[ab] repeat {rep + 1}: {variant}: "
                  f"{runs[variant][-1]['epoch_seconds']:.1f} s", flush=True)
    first = args.variant[0]
    summary = {v: {"epoch_seconds": spread(r["epoch_seconds"] / args.epochs for r in rs),
                   "vs_first": spread(r["epoch_seconds"] / f["epoch_seconds"]
                                      for r, f in zip(rs, runs[first], strict=True)),
                   "allreduce_share": spread(r["shares"].get("allreduce", 0.0) for r in rs),
                   "kernel_share_of_cpu": spread(r["cpu_kernel_seconds"] / (
                       r["cpu_kernel_seconds"] + r["cpu_user_seconds"]) for r in rs),
                   "data_share_first_epoch": spread(r["data_share_by_record"][0] for r in rs),
                   "data_share_later_epochs": spread(
                       x for r in rs for x in r["data_share_by_record"][1:]) if args.epochs > 1
                   else None}
               for v, rs in runs.items()}
    save(f"ab_{args.name}", {"data": args.data.name, "config": args.config, "np": args.np,
                             "backend": args.backend,
                             "epochs": args.epochs, "repeats": args.repeats,
                             "summary": summary, "runs": runs,
                             "bench_seconds": time.perf_counter() - t0}, args.out)
    print(json.dumps({v: {k: (s["median"] if isinstance(s, dict) else s)
                          for k, s in d.items()} for v, d in summary.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
