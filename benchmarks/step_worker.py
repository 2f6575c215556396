"""One benchmark worker: the CTSM training step, timed, under Horovod, PyTorch DDP or alone.

    horovodrun -np 2 --gloo python benchmarks/step_worker.py --backend horovod --data D --json J
    torchrun --nproc-per-node 2 benchmarks/step_worker.py --backend ddp --data D --json J
    python benchmarks/step_worker.py --backend local --data D --json J      # no communication

Every backend trains the same model on the same batches: each rank preloads `--batches` batches of
its own shard of the feature job's training split (so reading Parquet is not timed) and cycles
through them. Per step it times the local compute (forward + backward) and, under Horovod, the
wait in `optimizer.synchronize()` (what is left of the gradient allreduce once backward is done);
DDP overlaps its allreduce with backward, so there only the whole step is comparable. It also
records where the CPU went: the main thread's CPU time per phase (a spinning wait shows as CPU
busy while waiting) and each thread's share of a core over the timed steps, from /proc (Horovod's
background and Gloo's threads). `--backend local --shard R/N` trains on rank R's batches, for an
independent pair that does the same work as the N-rank job.

`--knobs` (JSON) sets compression, bpps, fusion_mb, cycle_ms, threads and affinity: one launch
per setting, because Horovod 0.28's Gloo rendezvous is not safe to restart within a launch (a
restarted rank can read its peer's old address: "Connection refused"). Rank 0 writes one JSON
object: samples/s, medians per rank and the gradient bytes each step moves.
`--items` enlarges the item vocabulary (dense embedding gradients) to make the model
communication-heavy; the extra ids never occur in the data.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from hvd_ctsm.config.model_config import ModelConfig
from hvd_ctsm.data.batches import plan_epoch, split_url, train_batches
from hvd_ctsm.data.dataset import Dataset
from hvd_ctsm.model.ctsm import CTSM
from hvd_ctsm.train.support import build_model_sizes

KNOBS = {"compression": "none", "bpps": 1, "fusion_mb": None, "cycle_ms": None, "threads": 1,
         "affinity": False, "sleeping_wait": None}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("horovod", "ddp", "local"), required=True)
    p.add_argument("--data", required=True, help="feature job output folder")
    p.add_argument("--json", required=True, help="where rank 0 writes the results")
    p.add_argument("--knobs", default="{}", help="JSON dict of knob settings (see KNOBS)")
    p.add_argument("--steps", type=int, default=40, help="timed optimizer steps per variant")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=8, help="batches preloaded per rank")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--items", type=int, default=0, help="item vocabulary (0: the data's)")
    p.add_argument("--shard", default=None, metavar="R/N",
                   help="--backend local: train on rank R's batches of an N-rank job (the same "
                        "batches that rank trains on, for a like-for-like independent pair)")
    p.add_argument("--loss", default="full", choices=("full", "sampled", "bce"))
    return p.parse_args(argv)


class Backend:
    """Start/stop, rank/size, the optimizer wrapper and the gather of results, per launcher."""

    def __init__(self, kind: str):
        self.kind = kind
        self.rank, self.size, self.sleeping_wait = 0, 1, None
        if kind == "horovod":  # the trainer's Horovod calls (started in start())
            from hvd_ctsm.distributed import horovod_backend

            self.hvd_module, self.dist = horovod_backend, None
        elif kind == "ddp":
            torch.distributed.init_process_group("gloo")
            self.rank, self.size = torch.distributed.get_rank(), torch.distributed.get_world_size()

    def start(self, knobs: dict) -> None:
        if knobs["affinity"]:  # one core per local rank; Horovod's thread beside its rank
            local = int(os.environ.get("HOROVOD_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0")))
            core = sorted(os.sched_getaffinity(0))[local % len(os.sched_getaffinity(0))]
            os.sched_setaffinity(0, {core})
            os.environ["HOROVOD_THREAD_AFFINITY"] = ",".join(
                str(c) for c in range(int(os.environ.get("HOROVOD_LOCAL_SIZE", "1"))))
        if self.kind == "horovod":
            self.dist = self.hvd_module.HorovodBackend(knobs["threads"], knobs["fusion_mb"],
                                                       knobs["cycle_ms"])
            self.sleeping_wait = knobs["sleeping_wait"]
            self.rank, self.size = self.dist.rank(), self.dist.size()
        torch.set_num_threads(knobs["threads"])

    def stop(self) -> None:
        if self.kind == "horovod":
            self.dist.shutdown()
        elif self.kind == "ddp":
            torch.distributed.barrier()  # no rank tears down while its peer still talks to it
            torch.distributed.destroy_process_group()

    def wrap(self, model, optimizer, knobs: dict):
        if self.kind == "horovod":
            optimizer = self.hvd_module.distributed_optimizer(
                optimizer, model, compression=knobs["compression"],
                backward_passes_per_step=knobs["bpps"])
            self.dist.broadcast_state(model, optimizer)
        elif self.kind == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
        return model, optimizer

    def gather(self, obj):
        if self.kind == "horovod":
            return self.dist.allgather_object(obj)
        if self.kind == "ddp":
            out = [None] * self.size
            torch.distributed.all_gather_object(out, obj)
            return out
        return [obj]


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) used so far by each thread of this process, from /proc:
    {thread id: (name, seconds)}. Linux only; {} elsewhere."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in Path("/proc/self/task").glob("*") if Path("/proc/self/task").exists() else ():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def cpu_by_thread(before: dict, after: dict, seconds: float) -> dict[str, float]:
    """Each thread's share of one core over the window, keyed 'main' or 'name:tid' (threads
    that used under 0.5% are summed into 'other')."""
    shares = {}
    for tid, (name, cpu) in after.items():
        used = (cpu - before.get(tid, (name, 0.0))[1]) / seconds
        key = "main" if tid == os.getpid() else f"{name}:{tid}"
        if key != "main" and used < 0.005:
            key = "other"
        shares[key] = shares.get(key, 0.0) + used
    return dict(sorted(shares.items(), key=lambda kv: -kv[1]))


def preload(args, rank: int, size: int, meta, rows: int) -> list[dict]:
    url = split_url(args.data, "train")
    plan = plan_epoch(url, size, rows)
    plan = replace(plan, steps=min(plan.steps, args.batches))
    return list(train_batches(url, rank, size, 0, plan, rows, meta.max_len, seed=0))


def timed_steps(model, optimizer, batches, args, backend, bpps: int) -> tuple[list, dict]:
    """warmup + steps optimizer steps; time compute, allreduce wait and the whole step, and
    measure each thread's CPU over the timed steps."""
    times = []
    model.train()
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            cpu_before, start = thread_cpu(), time.perf_counter()
        t0, c0 = time.perf_counter(), time.thread_time()
        for j in range(bpps):
            batch = batches[(i * bpps + j) % len(batches)]
            loss = sum(model(batch).values()) / bpps
            loss.backward()
        t1, c1 = time.perf_counter(), time.thread_time()
        if backend.kind == "horovod":
            backend.hvd_module.synchronize_gradients(optimizer, backend.sleeping_wait)
            t2, c2 = time.perf_counter(), time.thread_time()
            with optimizer.skip_synchronize():
                optimizer.step()
        else:
            t2, c2 = t1, c1
            optimizer.step()
        t3, c3 = time.perf_counter(), time.thread_time()
        optimizer.zero_grad()
        t4 = time.perf_counter()
        if i >= args.warmup:
            times.append({"compute": t1 - t0, "wait": t2 - t1, "update": t3 - t2,
                          "zero_grad": t4 - t3, "step": t4 - t0, "compute_cpu": c1 - c0,
                          "wait_cpu": c2 - c1, "update_cpu": c3 - c2})
    return times, cpu_by_thread(cpu_before, thread_cpu(), time.perf_counter() - start)


def summarise(gathered: list[dict], args, size: int, knobs: dict, numel: int) -> dict:
    """The job's time is the slowest rank's total (every step ends in a common allreduce)."""
    per_rank = [g["times"] for g in gathered]
    totals = [sum(t["step"] for t in times) for times in per_rank]
    waits = [sum(t["wait"] for t in times) / total
             for times, total in zip(per_rank, totals, strict=True)]
    medians = [{k: statistics.median(t[k] for t in times) for k in times[0]}
               for times in per_rank]
    samples = args.steps * knobs["bpps"] * args.batch_size * size
    wire_bytes = 2 if knobs["compression"] == "fp16" else 4
    return {"size": size, "knobs": knobs, "parameters": numel,
            "gradient_bytes_per_step": numel * wire_bytes,
            "samples_per_s": samples / max(totals), "seconds": max(totals),
            "step_median_s": max(m["step"] for m in medians),
            "compute_median_s": max(m["compute"] for m in medians),
            "wait_share": statistics.mean(waits), "per_rank": medians,
            # How much of the allreduce wait the main thread spent on a CPU (a spin shows ~1),
            # and the cores the process's other threads (Horovod's, Gloo's) took meanwhile.
            "wait_cpu_share": statistics.mean(
                sum(t["wait_cpu"] for t in times) / max(sum(t["wait"] for t in times), 1e-9)
                for times in per_rank),
            "other_threads_cores": statistics.mean(
                sum(v for k, v in g["threads"].items() if k != "main") for g in gathered),
            "cpu_by_thread": [g["threads"] for g in gathered]}


def main(argv=None) -> int:
    args = parse_args(argv)
    knobs = KNOBS | json.loads(args.knobs)
    backend = Backend(args.backend)
    backend.start(knobs)
    dataset = Dataset.open(args.data)
    meta = dataset.meta
    sizes = build_model_sizes(dataset)
    if args.items:
        sizes = replace(sizes, num_items=max(args.items, sizes.num_items))
    torch.manual_seed(0)
    model = CTSM(sizes, ModelConfig(dim=args.dim, layers=args.layers, heads=2, dropout=0.0,
                                     loss=args.loss))
    numel = sum(p.numel() for p in model.parameters())
    model, optimizer = backend.wrap(model, torch.optim.AdamW(model.parameters(), lr=1e-3), knobs)
    shard = (backend.rank, backend.size)
    if args.shard and args.backend == "local":
        shard = tuple(int(x) for x in args.shard.split("/"))
    batches = preload(args, *shard, meta, args.batch_size)
    times, threads = timed_steps(model, optimizer, batches, args, backend, knobs["bpps"])
    per_rank = backend.gather({"times": times, "threads": threads})
    if backend.rank == 0:
        result = {"backend": args.backend} | summarise(per_rank, args, backend.size, knobs, numel)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    backend.stop()
    return 0


if __name__ == "__main__":
    from hvd_ctsm import distributed
    plain_ddp = parse_args(None).backend == "ddp"
    # Plain DDP's Gloo threads outlive its process group, as the torch backend's do.
    distributed.exit_process(main(), own_torch_group=plain_ddp)
