"""The Horovod backend: the only module of the project that imports horovod.

HorovodBackend is the trainer's interface (hvd_ctsm.distributed.base.Backend); the functions
below it are its parts plus what only Horovod offers: Elastic Horovod and horovod.spark.
"""

from __future__ import annotations

import importlib
import os
import signal
import time
from contextlib import contextmanager, nullcontext

import torch

from hvd_ctsm.distributed.base import (Backend, BackendError, create_optimizer_state,
                                       horovod_importable)
from hvd_ctsm.errors import Terminated

_hvd = None  # horovod.torch once init() ran


class HorovodNotInstalled(BackendError, ValueError):
    """A Horovod route where Horovod is not installed (the current stack): one line, exit 2."""


def _import(module: str, route: str, instead: str):
    """`module` of Horovod's; where Horovod is not installed at all, HorovodNotInstalled naming
    the route, the classic stack and what to use instead (a broken install raises its own)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if horovod_importable():
            raise
        raise HorovodNotInstalled(
            f"{route} needs Horovod, which is not installed here (the current stack has none): "
            f"use the classic stack (./run.sh setup, HVD_CTSM_STACK=classic), or {instead}"
        ) from exc


def _horovod():
    global _hvd
    if _hvd is None:
        _hvd = _import("horovod.torch", "dist.backend=horovod",
                       "set dist.backend=torch and launch with torchrun")
    return _hvd


def build_info() -> dict:
    """What this Horovod was built with (the facts `horovodrun --check-build` prints)."""
    hvd = _horovod()
    import horovod

    return {
        "version": horovod.__version__,
        "pytorch": True,  # the import of horovod.torch above succeeded
        "gloo": bool(hvd.gloo_built()),
        "mpi": bool(hvd.mpi_built()),
        "nccl": bool(hvd.nccl_built()),
    }


# Horovod's background thread wakes every cycle to negotiate with the other ranks. On a CPU-only
# machine it competes with the ranks' own compute for the same cores; at Horovod's default cycle
# (1 ms) that cost more than the latency it saves (benchmarks/RESULTS.md, "knobs").
CPU_CYCLE_TIME_MS = 20.0


def set_horovod_knobs(fusion_threshold_mb: float | None, cycle_time_ms: float | None) -> None:
    """Map our config onto Horovod's environment; must happen before init().

    None keeps Horovod's own value (or the user's HOROVOD_* variable), except the cycle time on a
    machine without CUDA, which becomes CPU_CYCLE_TIME_MS unless HOROVOD_CYCLE_TIME is set.
    """
    if fusion_threshold_mb is not None:
        os.environ["HOROVOD_FUSION_THRESHOLD"] = str(int(fusion_threshold_mb * 1024 * 1024))
    if cycle_time_ms is None and not torch.cuda.is_available():
        os.environ.setdefault("HOROVOD_CYCLE_TIME", str(CPU_CYCLE_TIME_MS))
    elif cycle_time_ms is not None:
        os.environ["HOROVOD_CYCLE_TIME"] = str(cycle_time_ms)


def init(threads_per_rank: int | None = None) -> None:
    """Start Horovod (size 1 when not launched by horovodrun) and share the cores between ranks."""
    hvd = _horovod()
    hvd.init()
    if threads_per_rank is None:
        threads_per_rank = max(1, (os.cpu_count() or 1) // hvd.local_size())
    torch.set_num_threads(threads_per_rank)
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())


def broadcast_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Make every rank start from rank 0's parameters and optimizer state. Each rank makes its
    optimizer's state first (create_optimizer_state, which leaves the weights), so that Horovod
    does not make it with a step that would decay them."""
    hvd = _horovod()
    create_optimizer_state(optimizer)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)


def distributed_optimizer(
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    compression: str = "none",
    backward_passes_per_step: int = 1,
    op: str = "average",
    gradient_predivide_factor: float = 1.0,
) -> torch.optim.Optimizer:
    """Wrap the optimizer so that step() averages (or Adasum-combines) gradients across ranks."""
    hvd = _horovod()
    if op == "adasum" and not hvd.mpi_enabled():
        raise ValueError("dist.op=adasum needs Horovod's MPI controller (it has no Adasum over "
                         "Gloo): launch with `horovodrun --mpi` or mpirun")
    compressions = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}
    ops = {"average": hvd.Average, "adasum": hvd.Adasum, "sum": hvd.Sum}
    return hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=compressions[compression],
        backward_passes_per_step=backward_passes_per_step,
        op=ops[op],
        gradient_predivide_factor=gradient_predivide_factor,
    )


# Horovod's own wait for an allreduce (synchronize) spins on sched_yield. Where the ranks' compute
# shares the CPU with that wait, a rank that finished its backward early burns a core the slower
# rank and both Horovod threads need (benchmarks/ANALYSIS.md). Sleeping between polls frees it;
# the first polls come quickly, so a wait costs at most POLL_MAX_S of extra latency.
POLL_FIRST_S, POLL_MAX_S = 0.0001, 0.001


def wait_for_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Block until every gradient allreduce the wrapped optimizer started has finished, sleeping
    between polls; the optimizer's synchronize() then finds them done and does not spin."""
    hvd = _horovod()
    for handle, _ in list(getattr(optimizer, "_handles", {}).values()):
        if callable(handle):  # a sparse gradient's allgathers: synchronize() waits for them
            continue
        pause = POLL_FIRST_S
        while handle is not None and not hvd.poll(handle):
            time.sleep(pause)
            pause = min(2 * pause, POLL_MAX_S)


def synchronize_gradients(optimizer: torch.optim.Optimizer,
                          sleeping_wait: bool | None = None) -> None:
    """optimizer.synchronize(): the averaged gradients are in place when it returns.

    sleeping_wait: sleep while waiting instead of Horovod's spin; None: on without CUDA (with
    GPUs the host's cores are spare and the spin answers fastest)."""
    if sleeping_wait is None:
        sleeping_wait = not torch.cuda.is_available()
    if sleeping_wait:
        wait_for_gradients(optimizer)
    optimizer.synchronize()


@contextmanager
def skip_synchronize(optimizer):
    """optimizer.step() without a second synchronize, after an explicit (timed) synchronize()."""
    with optimizer.skip_synchronize():
        yield


def shutdown() -> None:
    if _hvd is not None:
        _hvd.shutdown()


# --- Elastic Horovod (hvd_ctsm.train.elastic holds the training logic; only the calls live here)
# ---


def is_elastic_launch() -> bool:
    """True under `horovodrun --min-np/--max-np/--host-discovery-script` (elastic mode)."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"


def elastic_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, **values):
    """hvd.elastic.TorchState: model and optimizer plus plain values, saved on commit(),
    restored after a worker failure and broadcast from rank 0 to new workers. The optimizer's
    state is made first (create_optimizer_state), so that Horovod's sync never makes it with a
    step that would decay a new worker's weights after they were broadcast."""
    create_optimizer_state(optimizer)
    return _horovod().elastic.TorchState(model=model, optimizer=optimizer, **values)


def elastic_run(fn):
    """hvd.elastic.run: call fn(state) again after a failure (restored to the last commit) or a
    change of hosts, on the new set of workers."""
    return _horovod().elastic.run(fn)


# --- Horovod on Spark (horovod.spark is imported only when these are called) -------------------


def spark_run(fn, args: tuple = (), num_proc: int = 2, env: dict | None = None,
              start_timeout: int | None = None, verbose: int = 1,
              nics: list[str] | None = None) -> list:
    """Run fn(*args) as `num_proc` Horovod ranks over Gloo, one per Spark task of the active
    SparkContext (horovod.spark.run); returns fn's results in rank order.

    The ranks are processes started by the Spark tasks with the driver's interpreter, so
    executors must have the same Python environment (true in local mode and on a cluster with
    the package installed on every node). nics: the network interfaces Horovod's services and
    the Gloo ranks use (None: every interface the tasks share)."""
    spark = _import("horovod.spark", "horovod.spark.run",
                    "set dist.backend=torch (TorchDistributor runs the same trainer)")
    with horovod_on_spark():
        return spark.run(fn, args=args, num_proc=num_proc, use_gloo=True, env=env,
                         start_timeout=start_timeout, verbose=verbose,
                         nics=set(nics) if nics else None)


@contextmanager
def horovod_on_spark():
    """Around horovod.spark.run: Horovod's signal handlers put back after it, its own job
    cancel unsaid, and a run that Ctrl-C stopped raised as KeyboardInterrupt (SIGTERM: as
    errors.Terminated), not as the ranks' failure. (A TorchEstimator's fit, tried, leaves the
    handlers as they were.)"""
    with horovods_signal_handlers() as stopped_by, its_own_cancel_unsaid():
        try:
            yield
        except Exception:
            signum = stopped_by()  # Ctrl-C: the ranks' exit 143 is no failure of theirs
            if signum == signal.SIGTERM:
                raise Terminated("stopped by SIGTERM: the training ranks were stopped") from None
            if signum is not None:
                raise KeyboardInterrupt("interrupted: the training ranks were stopped") from None
            raise


@contextmanager
def its_own_cancel_unsaid():
    """While horovod.spark.run runs: when a rank fails or Ctrl-C stops them, Horovod cancels
    its Spark job group, and the thread that waited on that job printed its traceback (30
    lines of Python and Java: "Job 44 cancelled part of cancelled job group") above the line
    that says why. That one goes unsaid; any other error of a thread is printed as before."""
    import threading

    previous = threading.excepthook

    def hook(args) -> None:
        if "cancelled job group horovod.spark.run" not in str(args.exc_value):
            previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = previous


@contextmanager
def horovods_signal_handlers():
    """While horovod.spark.run runs: its launcher (horovod.runner.gloo_run.launch_gloo) makes
    SIGINT and SIGTERM set an event that stops the ranks (exit 143), and never puts the
    handlers back, so that after one training on Spark Ctrl-C did nothing (the pipeline's
    backtest, a notebook's interrupt), and a Ctrl-C during it ended as a failed run (exit 3
    and a Java trace). The handlers are put back after; yields a function that tells which
    signal Horovod's handlers took (SIGINT, SIGTERM; None if none came)."""
    gloo_run = importlib.import_module("horovod.runner.gloo_run")
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    register, came = gloo_run.register_shutdown_event, []

    def registered():
        event = register()
        for sig in before:  # Horovod's handler, noting which signal came first
            horovods = signal.getsignal(sig)
            if callable(horovods):
                signal.signal(sig, lambda signum, frame, handler=horovods: (
                    came.append(signum), handler(signum, frame)))
        return event

    gloo_run.register_shutdown_event = registered
    try:
        yield lambda: came[0] if came else None
    finally:
        gloo_run.register_shutdown_event = register
        for sig, handler in before.items():
            signal.signal(sig, handler)


def torch_estimator(**kwargs):
    """horovod.spark.torch.TorchEstimator(**kwargs) (the driver script must be guarded by
    `if __name__ == "__main__":`: the estimator starts processes with spawn)."""
    estimators = _import("horovod.spark.torch", "the TorchEstimator route",
                         "train with hvd_ctsm.api.train_model (TorchDistributor)")
    return estimators.TorchEstimator(**kwargs)


def spark_store(path: str):
    """horovod.spark.common.store.Store for a path: LocalStore for a local folder, HDFSStore for
    hdfs://, DBFSLocalStore for /dbfs/ on Databricks (Store.create picks by prefix)."""
    stores = _import("horovod.spark.common.store", "the TorchEstimator route",
                     "train with hvd_ctsm.api.train_model (TorchDistributor)")
    return stores.Store.create(path)


class HorovodBackend(Backend):
    """Horovod: the optimizer is wrapped (hvd.DistributedOptimizer) and averages the gradients
    in its synchronize(); the model is called as it is."""

    name = "horovod"

    def __init__(self, threads_per_rank: int | None = None,
                 fusion_threshold_mb: float | None = None, cycle_time_ms: float | None = None,
                 knobs: bool = True):
        if knobs:  # False: Horovod's own defaults (hvd_ctsm.distributed.init)
            set_horovod_knobs(fusion_threshold_mb, cycle_time_ms)
        init(threads_per_rank)
        self.adasum = False

    def rank(self) -> int:
        return _horovod().rank()

    def size(self) -> int:
        return _horovod().size()

    def local_rank(self) -> int:
        return _horovod().local_rank()

    def local_size(self) -> int:
        return _horovod().local_size()

    def wrap(self, model, optimizer, cfg):
        self.adasum = cfg.op == "adasum"
        return model, distributed_optimizer(
            optimizer, model, compression=cfg.compression,
            backward_passes_per_step=cfg.backward_passes_per_step, op=cfg.op,
            gradient_predivide_factor=cfg.gradient_predivide_factor)

    # Horovod's Adasum optimizer combines updates inside step() and cannot skip that: its
    # communication is timed as "step" and clipping applies to the local gradients.
    def finish_gradient_reduce(self, optimizer, sleeping_wait=None) -> None:
        if not self.adasum:
            synchronize_gradients(optimizer, sleeping_wait)

    def stepping(self, optimizer):
        return nullcontext() if self.adasum else optimizer.skip_synchronize()

    def allreduce_sum(self, values, name=None):
        """Exact sum across ranks (float64 on the wire for counts and sums of metrics)."""
        hvd = _horovod()
        return hvd.allreduce(values.detach().to(torch.float64).cpu(), op=hvd.Sum, name=name)

    def allgather_object(self, obj) -> list:
        return _horovod().allgather_object(obj)

    def broadcast_object(self, obj, root_rank: int = 0):
        return _horovod().broadcast_object(obj, root_rank=root_rank)

    def broadcast_state(self, model, optimizer) -> None:
        broadcast_state(model, optimizer)

    def shutdown(self) -> None:
        shutdown()
