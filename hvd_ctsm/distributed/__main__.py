"""The self-test: allreduce rank-dependent tensors; every rank must hold the exact sum.

    horovodrun -np 2 --gloo python -m hvd_ctsm.distributed selftest
    torchrun --standalone --nproc-per-node 2 -m hvd_ctsm.distributed selftest

And what this Horovod was built with, in one process (`horovodrun --check-build` starts one
Python per fact it prints, 15 s on 2 cores):

    python -m hvd_ctsm.distributed build

The backend is dist.backend=auto's choice for the launch (torch under torchrun).
"""

from __future__ import annotations

import json
import sys
import time

import torch

from hvd_ctsm import distributed as dist


def selftest() -> int:
    backend = dist.start("auto", threads_per_rank=1)
    r, n = backend.rank(), backend.size()
    t0 = time.perf_counter()
    got = backend.allreduce_sum(torch.arange(4, dtype=torch.float64) + 10 * r, name="selftest")
    want = torch.arange(4, dtype=torch.float64) * n + 10 * sum(range(n))
    ok = bool(torch.equal(got, want))
    report = {"rank": r, "size": n, "backend": backend.name, "sum": got.tolist(),
              "expected": want.tolist(), "ok": ok, "seconds": round(time.perf_counter() - t0, 4)}
    if backend.name == "horovod":
        report |= dist.build_info()
    print("SELFTEST " + json.dumps(report), flush=True)
    backend.shutdown()
    return 0 if ok else 1


def build() -> int:
    print("BUILD " + json.dumps(dist.build_info()), flush=True)
    return 0


if __name__ == "__main__":
    commands = {"selftest": selftest, "build": build}
    if len(sys.argv) == 2 and sys.argv[1] in commands:
        dist.exit_process(commands[sys.argv[1]]())
    sys.exit("usage: python -m hvd_ctsm.distributed selftest|build")
