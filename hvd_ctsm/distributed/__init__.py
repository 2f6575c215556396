"""Everything distributed, in one package: the rest of the project never imports horovod or
torch.distributed.

The trainer starts one backend (dist.backend: auto, horovod or torch) and asks it to wrap the
model and optimizer, finish the gradient reduction, broadcast the initial state and combine
metrics; the model knows nothing of distribution.

    backend = start(cfg.dist.backend, cfg.dist.threads_per_rank, ...)
    net, optimizer = backend.wrap(model, optimizer, cfg.dist)

The functions below (rank(), allreduce_sum(), ...) call the backend that was started. Horovod's own
extras (Elastic Horovod, horovod.spark) are re-exported from horovod_backend; Spark's
TorchDistributor route is torch_spark (torch_spark_run, and a failed rank's line for the rank
whose result comes back). The self-test runs
under either launcher:

    horovodrun -np 2 --gloo python -m hvd_ctsm.distributed selftest
    torchrun --standalone --nproc-per-node 2 -m hvd_ctsm.distributed selftest

./run.sh starts both launchers through `launchers`, in its process, so that a run whose workers
failed ends in one line and the exit code they mean.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import sys
from typing import NoReturn

import torch

from hvd_ctsm.distributed.base import (BACKENDS, Backend, BackendError, horovod_importable,
                                       launch_rank, launched_by_horovod, launched_by_torchrun,
                                       resolve, restarted_by_launcher, usable_backends)
from hvd_ctsm.distributed.horovod_backend import (build_info, distributed_optimizer, elastic_run,
                                                  elastic_state, is_elastic_launch, spark_run,
                                                  spark_store, synchronize_gradients,
                                                  torch_estimator)

__all__ = ["BACKENDS", "Backend", "BackendError", "allgather_object", "allreduce_mean",
           "allreduce_sum", "broadcast_object", "broadcast_state", "build_info", "check_config",
           "current", "distributed_optimizer", "elastic_run", "elastic_state", "exit_process",
           "horovod_importable", "init", "is_elastic_launch", "is_root", "launch_rank",
           "launched_by_horovod", "launched_by_torchrun", "local_rank", "parse_selftest", "rank",
           "resolve", "restarted_by_launcher", "shutdown", "size", "spark_run", "spark_store",
           "start", "synchronize_gradients", "torch_estimator", "torch_spark_run",
           "usable_backends"]

_active: Backend | None = None


def start(choice: str = "auto", threads_per_rank: int | None = None,
          fusion_threshold_mb: float | None = None,
          cycle_time_ms: float | None = None) -> Backend:
    """Start the backend `choice` resolves to in this launch (base.resolve) and make it current."""
    global _active
    kind = resolve(choice)
    if kind == "horovod":
        from hvd_ctsm.distributed.horovod_backend import HorovodBackend as Chosen
    elif kind == "torch":
        from hvd_ctsm.distributed.torch_backend import TorchBackend as Chosen
    else:
        Chosen = Backend  # noqa: N806  a class, named as one
    _active = Chosen(threads_per_rank, fusion_threshold_mb, cycle_time_ms)
    return _active


def check_config(choice: str, dist_cfg) -> str:
    """The backend `choice` resolves to here, once it is known to accept the DistConfig's
    settings (BackendError with the fix otherwise); called before any worker starts one."""
    kind = resolve(choice)
    if kind == "torch":
        from hvd_ctsm.distributed.torch_backend import check_options

        check_options(dist_cfg)
    return kind


def init(threads_per_rank: int | None = None) -> Backend:
    """Start Horovod with its own knobs (size 1 when not launched by horovodrun)."""
    global _active
    from hvd_ctsm.distributed.horovod_backend import HorovodBackend

    resolve("horovod")
    _active = HorovodBackend(threads_per_rank, knobs=False)
    return _active


def current() -> Backend:
    if _active is None:
        raise RuntimeError("no distributed backend started: call hvd_ctsm.distributed.start()")
    return _active


def rank() -> int:
    return current().rank()


def size() -> int:
    return current().size()


def local_rank() -> int:
    return current().local_rank()


def is_root() -> bool:
    return current().is_root()


def allreduce_sum(values: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """Exact sum across ranks (float64 on the wire for counts and sums of metrics)."""
    return current().allreduce_sum(values, name=name)


def allreduce_mean(metrics: dict[str, float]) -> dict[str, float]:
    """Average scalar metrics over ranks, one allreduce for the lot."""
    if not metrics:
        return {}
    keys = sorted(metrics)
    summed = allreduce_sum(torch.tensor([float(metrics[k]) for k in keys]), name="metrics_mean")
    return {k: float(v) / size() for k, v in zip(keys, summed.tolist(), strict=True)}


def allgather_object(obj) -> list:
    return current().allgather_object(obj)


def broadcast_object(obj, root_rank: int = 0):
    return current().broadcast_object(obj, root_rank)


def broadcast_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Make every rank start from rank 0's parameters and optimizer state."""
    current().broadcast_state(model, optimizer)


def shutdown() -> None:
    if _active is not None:
        _active.shutdown()


def exit_process(code: int, own_torch_group: bool = False) -> NoReturn:
    """End a command's process with `code`; the trainer's program ends here on every rank.
    own_torch_group: the process ran a torch.distributed group of its own, not through a
    backend started here (a benchmark's plain DDP).

    Under the torch backend, Gloo's threads outlive destroy_process_group(): importing
    torch._dynamo (torch.optim does) leaves ten references to the default group that nothing
    in Python can drop, so the group is freed only while the interpreter tears itself down.
    In one full test run a rank that had trained, saved and left the barrier aborted there
    ("terminate called without an active exception", SIGABRT), and torchrun failed the whole
    job; likely a Gloo thread that needed the GIL after the interpreter had stopped handing it
    out (PyTorch has reports of that abort from groups left to teardown). Such a process runs
    its exit handlers (logging's flush, the MLflow run's end), flushes its streams and leaves
    with os._exit, skipping that teardown.
    """
    if own_torch_group or (_active is not None and _active.threads_outlive_shutdown()):
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def torch_spark_run(fn, args: tuple = (), num_proc: int = 2, local_mode: bool = False,
                    use_gpu: bool = False):
    """fn(*args) in `num_proc` torch ranks started by Spark's TorchDistributor (rank 0's result);
    the ranks start the torch backend (dist.backend auto or torch)."""
    from hvd_ctsm.distributed.torch_spark import spark_run as run

    return run(fn, args, num_proc, local_mode=local_mode, use_gpu=use_gpu)


def parse_selftest(output: str) -> list[dict]:
    """The SELFTEST reports in a launcher's output (mpirun may put two ranks on one line)."""
    return [json.loads(m) for m in re.findall(r"SELFTEST (\{[^{}]*\})", output)]
