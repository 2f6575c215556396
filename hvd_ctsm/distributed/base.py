"""The backend interface the trainer talks to, the single-process backend, and the choice of one.

A backend is what differs between Horovod and torch.distributed: who the ranks are, how the model
and optimizer are wrapped so that gradients are averaged, when that averaging has finished, and
the few collectives the trainer needs for metrics, checkpoints and the initial state. Everything
else (model, data plan, checkpoints, metrics, run folder) is the same whichever backend trains.
"""

from __future__ import annotations

import importlib.util
import os
from contextlib import nullcontext

import torch

BACKENDS = ("auto", "horovod", "torch")
# The variables each launcher sets for its workers, read before any backend is started.
HOROVOD_RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


class BackendError(RuntimeError):
    """A backend that cannot serve this launch; the message names the fix."""


class Backend:
    """One process: rank 0 of 1. The distributed backends override what differs."""

    name = "single"

    def __init__(self, threads_per_rank: int | None = None,
                 fusion_threshold_mb: float | None = None, cycle_time_ms: float | None = None):
        set_threads(threads_per_rank, 1)

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1

    def local_rank(self) -> int:
        return 0

    def local_size(self) -> int:
        return 1

    def is_root(self) -> bool:
        return self.rank() == 0

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg
             ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """(module to call forward on, optimizer to step) so that gradients are combined over
        ranks as `cfg` (a DistConfig) asks. The module's state_dict stays the model's own."""
        return model, optimizer

    def accumulating(self, net: torch.nn.Module, last: bool):
        """Context around one micro-batch's forward and backward; `last` is the one whose
        backward should start the gradient reduction."""
        return nullcontext()

    def finish_gradient_reduce(self, optimizer: torch.optim.Optimizer,
                               sleeping_wait: bool | None = None) -> None:
        """Return once the combined gradients are in place (the trainer times this wait)."""

    def stepping(self, optimizer: torch.optim.Optimizer):
        """Context around optimizer.step() after finish_gradient_reduce()."""
        return nullcontext()

    def allreduce_sum(self, values: torch.Tensor, name: str | None = None) -> torch.Tensor:
        """Exact sum across ranks, float64 on the wire (counts and sums of metrics)."""
        return values.detach().to(torch.float64).cpu()

    def allgather_object(self, obj) -> list:
        return [obj]

    def broadcast_object(self, obj, root_rank: int = 0):
        return obj

    def broadcast_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Every rank continues from rank 0's parameters and optimizer state."""
        create_optimizer_state(optimizer)

    def shutdown(self) -> None:
        pass

    def threads_outlive_shutdown(self) -> bool:
        """True when shutdown() leaves native threads that only the interpreter's teardown
        stops (hvd_ctsm.distributed.exit_process)."""
        return False


def create_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer its state by one step on zero gradients (Adam's step count starts
    at 1), as Horovod's broadcast_optimizer_state does: every backend then trains the same
    numbers, and a checkpoint written by one resumes bit for bit under another.

    The step leaves the parameters as they are: weight decay is off for it (Adam moves nothing
    on zero gradients), since on a resume only rank 0 has read its state, and a decaying first
    step on the other ranks would shrink their weights after they were made rank 0's. It is
    the torch optimizer's own step, not a wrapper's (Horovod's would wait for an allreduce
    that the ranks with a state never join)."""
    if optimizer.state_dict()["state"]:
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    own_step = next(cls.step for cls in type(optimizer).__mro__
                    if cls.__module__.startswith("torch.optim"))
    decays = [group.get("weight_decay", 0.0) for group in optimizer.param_groups]
    try:
        for group in optimizer.param_groups:
            group["weight_decay"] = 0.0
        own_step(optimizer)
    finally:
        for group, decay in zip(optimizer.param_groups, decays, strict=True):
            group["weight_decay"] = decay


def set_threads(threads_per_rank: int | None, local_size: int) -> None:
    """Share the machine's cores between the ranks on it."""
    if threads_per_rank is None:
        threads_per_rank = max(1, (os.cpu_count() or 1) // max(local_size, 1))
    torch.set_num_threads(threads_per_rank)


def launched_by_torchrun(env=os.environ) -> bool:
    return "TORCHELASTIC_RUN_ID" in env or ("LOCAL_RANK" in env and "WORLD_SIZE" in env)


def launched_by_horovod(env=os.environ) -> bool:
    return any(name in env for name in HOROVOD_RANK_VARIABLES)


def horovod_importable() -> bool:
    return importlib.util.find_spec("horovod") is not None


def usable_backends() -> dict[str, str]:
    """Each backend -> '' when this environment can train with it, else why not."""
    import torch.distributed as td

    torch_ok = td.is_available() and td.is_gloo_available()
    if torch_ok and torch.cuda.is_available() and not td.is_nccl_available():
        torch_ok = False
    return {"torch": "" if torch_ok else "this torch has no torch.distributed with Gloo "
                                         "(and NCCL on a GPU machine)",
            "horovod": "" if horovod_importable() else "Horovod is not installed"}


def launch_rank(env=os.environ) -> int:
    """This worker's global rank as its launcher announced it (0 when not launched)."""
    for name in (*HOROVOD_RANK_VARIABLES, "RANK"):
        if name in env:
            return int(env[name])
    return 0


def restarted_by_launcher(env=os.environ) -> bool:
    """torchrun --max-restarts started this worker again after a failure."""
    return int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0


def resolve(choice: str, env=os.environ, horovod_installed: bool | None = None) -> str:
    """'horovod', 'torch' or 'single' for dist.backend=`choice` in this launch.

    auto: torch under torchrun, Horovod when it is installed, else one process."""
    if choice not in BACKENDS:
        raise BackendError(f"dist.backend={choice!r} is not one of {list(BACKENDS)}")
    if horovod_installed is None:
        horovod_installed = horovod_importable()
    torchrun = launched_by_torchrun(env)
    if choice == "auto":
        return "torch" if torchrun else ("horovod" if horovod_installed else "single")
    if choice == "horovod":
        if torchrun:
            raise BackendError("dist.backend=horovod, but torchrun started this worker: launch "
                               "with horovodrun, or set dist.backend=torch (or auto)")
        if not horovod_installed:
            raise BackendError("dist.backend=horovod, but Horovod is not installed (the current "
                               "stack has none): use the classic stack (./run.sh setup without "
                               "HVD_CTSM_BACKENDS=torch), or set dist.backend=torch and launch "
                               "with torchrun")
    if choice == "torch" and launched_by_horovod(env):
        raise BackendError("dist.backend=torch, but horovodrun started this worker: launch with "
                           "torchrun, or set dist.backend=horovod (or auto)")
    return choice
