"""A worker for test_torch_backend's exit test: starts the torch backend (under torchrun: a Gloo
process group), then ends through hvd_ctsm.distributed.exit_process with argv[2] as the code.
It marks in folder argv[1] whether its exit handlers ran and whether the interpreter tore its
modules down (a module global's __del__ runs only then)."""

import atexit
import sys
from pathlib import Path

import torch._dynamo.utils  # noqa: F401  as torch.optim imports it in the trainer

from hvd_ctsm import distributed as dist

folder, code = Path(sys.argv[1]), int(sys.argv[2])
backend = dist.start("auto", threads_per_rank=1)
rank = backend.rank()
atexit.register(lambda: (folder / f"atexit-{rank}").touch())


class MarksTeardown:
    def __init__(self, path: str):
        self.path, self.open = path, open  # the module's globals may be gone by then

    def __del__(self):
        self.open(self.path, "w").close()


marker = MarksTeardown(str(folder / f"teardown-{rank}"))
backend.allreduce_sum(torch.ones(2))
backend.shutdown()
dist.exit_process(code)
