"""The torch.distributed backend: DistributedDataParallel over Gloo (CPU) or NCCL (GPU).

    torchrun --standalone --nproc-per-node 2 -m hvd_ctsm.train --data DIR --out RUN

DDP averages the gradients while backward runs, bucket by bucket (dist.fusion_threshold_mb is the
bucket size, as it is Horovod's fusion buffer): when the last micro-batch's backward returns they
are in place, so the time ranks spend waiting for each other shows in the "backward" phase of the
step timer, not in "allreduce". The micro-batches before the last (dist.backward_passes_per_step)
run under DDP's no_sync. dist.compression=fp16 is DDP's fp16 compression comm hook. Sparse item
gradients (dist.sparse_gradients) go through Gloo's sparse allreduce on a CPU; NCCL has none
("NCCL does not support all_reduce with sparse tensors", the first step of a run on a GPU), so
there a comm hook gathers each rank's rows instead (sparse_allgather_hook).

Started by torchrun (it sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT); without it, one
process with no process group.
"""

from __future__ import annotations

import atexit
import inspect
import os
import tempfile
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as td
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from hvd_ctsm.distributed.base import Backend, BackendError, create_optimizer_state, set_threads
from hvd_ctsm.files.outputs import remove_empty_folders

DDP_BUCKET_MB = 25.0  # DDP's own default bucket size, used when dist.fusion_threshold_mb is None

# DDP broadcasts every buffer from rank 0 at the start of each training forward, by default. The
# model's buffers are lookups made from the dataset's metadata (an item's tags, a place's row),
# the same on every rank and never trained: at 10^6 items about 12 MB broadcast a step, and a
# wait for rank 0 before every forward. Built the same on every rank, they still sync once at
# start (torch >= 2.13's forward_sync_buffers=False keeps that; its broadcast_buffers=False,
# for older torch, skips it, harmless here). tests/unit/test_model.py holds them constant.
NO_BUFFER_SYNC = ({"forward_sync_buffers": False}
                  if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                  else {"broadcast_buffers": False})


def check_options(cfg) -> None:
    """DistConfig values that only Horovod has stop here with the fix, before any step."""
    if cfg.op != "average":
        raise BackendError(f"dist.op={cfg.op} needs Horovod (DDP averages gradients): set "
                           "dist.backend=horovod and launch with horovodrun --mpi")
    if cfg.gradient_predivide_factor != 1.0:
        raise BackendError("dist.gradient_predivide_factor is Horovod's: DDP divides before the "
                           "sum already; leave it at 1.0 with dist.backend=torch")


def optimizer_layout(optimizer, params: list) -> dict:
    """The optimizer's settings by group and, for each parameter's state, its plain values and
    its tensors' shape, dtype and place (on the parameter's device or the CPU), not their data."""
    def entry(param, value):
        if not torch.is_tensor(value):
            return ("value", value)
        return ("tensor", value.shape, value.dtype, value.device == param.device)

    return {"groups": [{k: v for k, v in g.items() if k != "params"}
                       for g in optimizer.param_groups],
            "states": [{key: entry(p, value) for key, value in optimizer.state[p].items()}
                       for p in params]}


def sparse_allgather_hook(group, bucket):  # DDP refuses a string annotation
    """A DDP comm hook: a dense bucket goes through DDP's own allreduce; a sparse one (DDP gives
    each sparse gradient a bucket of its own) is averaged by gathering every rank's rows and
    values, padded to the most any rank holds, where NCCL has no sparse allreduce. The result
    names each row once (coalesced), as Gloo's sparse allreduce does."""
    grad = bucket.buffer()
    if not grad.is_sparse:
        return default_hooks.allreduce_hook(group, bucket)
    group = group or td.group.WORLD
    world = td.get_world_size(group)
    grad = grad.coalesce()
    index, values = grad.indices()[0], grad.values()
    counts = [torch.zeros(1, dtype=torch.long, device=values.device) for _ in range(world)]
    td.all_gather(counts, torch.tensor([len(index)], device=values.device), group=group)
    counts = [int(c) for c in counts]
    padding = max(counts) - len(index)
    index = torch.nn.functional.pad(index, (0, padding))
    values = torch.nn.functional.pad(values, (0, 0, 0, padding))
    indices, rows = [torch.empty_like(index) for _ in counts], [torch.empty_like(values)
                                                              for _ in counts]
    td.all_gather(indices, index, group=group)
    td.all_gather(rows, values, group=group)
    index = torch.cat([i[:n] for i, n in zip(indices, counts, strict=True)])
    values = torch.cat([v[:n] for v, n in zip(rows, counts, strict=True)]).div_(world)
    future = torch.futures.Future()
    future.set_result(torch.sparse_coo_tensor(index[None], values, grad.shape).coalesce())
    return future


class TorchBackend(Backend):
    """torch.distributed: the model is wrapped in DDP; the optimizer is the plain one."""

    name = "torch"

    def __init__(self, threads_per_rank: int | None = None,
                 fusion_threshold_mb: float | None = None, cycle_time_ms: float | None = None):
        # cycle_time_ms is Horovod's background cycle; DDP has none, so it is not used here.
        self.launched = "WORLD_SIZE" in os.environ
        self.bucket_mb = fusion_threshold_mb or DDP_BUCKET_MB
        self.cuda = torch.cuda.is_available()
        self._local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self._local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        set_threads(threads_per_rank, self._local_size)
        if self.cuda:
            torch.cuda.set_device(self._local_rank)
        if self.launched:  # a rank that fails leaves its folder empty too: any end but a kill
            atexit.register(remove_torchrun_log_folders, dict(os.environ))
        if self.launched and not td.is_initialized():
            # The rendezvous store outlives a torchrun restart, and with it the addresses the
            # killed workers published: each attempt gets keys of its own.
            store, rank, size = next(td.rendezvous("env://"))
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            td.init_process_group("nccl" if self.cuda else "gloo",
                                  store=td.PrefixStore(f"hvd_ctsm/attempt_{attempt}", store),
                                  rank=rank, world_size=size)

    def rank(self) -> int:
        return td.get_rank() if self.launched else 0

    def size(self) -> int:
        return td.get_world_size() if self.launched else 1

    def local_rank(self) -> int:
        return self._local_rank

    def local_size(self) -> int:
        return self._local_size

    def wrap(self, model, optimizer, cfg):
        check_options(cfg)
        if not self.launched:
            return model, optimizer
        net = DistributedDataParallel(model, device_ids=[self._local_rank] if self.cuda else None,
                                      bucket_cap_mb=self.bucket_mb, **NO_BUFFER_SYNC)
        if cfg.compression == "fp16":
            net.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif td.get_backend() == "nccl" and any(isinstance(m, torch.nn.Embedding) and m.sparse
                                                for m in model.modules()):
            net.register_comm_hook(None, sparse_allgather_hook)
        return net, optimizer

    def accumulating(self, net, last: bool):
        if last or not isinstance(net, DistributedDataParallel):
            return nullcontext()
        return net.no_sync()  # gradients add up locally; the last backward reduces them

    def _wire(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.cuda() if self.cuda else tensor  # NCCL reduces CUDA tensors only

    def allreduce_sum(self, values, name=None):
        total = values.detach().to(torch.float64).cpu()
        if not self.launched:
            return total
        total = self._wire(total)
        td.all_reduce(total, op=td.ReduceOp.SUM)
        return total.cpu()

    def allgather_object(self, obj) -> list:
        if not self.launched:
            return [obj]
        out = [None] * self.size()
        td.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj, root_rank: int = 0):
        if not self.launched:
            return obj
        box = [obj]
        td.broadcast_object_list(box, src=root_rank)
        return box[0]

    def broadcast_state(self, model, optimizer) -> None:
        if not self.launched:
            return create_optimizer_state(optimizer)
        for tensor in model.state_dict().values():  # views of the parameters and buffers
            td.broadcast(tensor, src=0)
        create_optimizer_state(optimizer)
        self._broadcast_optimizer_state(optimizer)

    def _broadcast_optimizer_state(self, optimizer) -> None:
        """Rank 0's optimizer state on every rank, tensor by tensor in place. Pickled whole (as
        broadcast_object does) it was held two or three times over on each rank at once: 1.5 GB
        more a rank at 10^6 items, the two moments of the item table. Its layout goes first, as
        an object: only rank 0 read a resumed checkpoint."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        layout = self.broadcast_object(optimizer_layout(optimizer, params)
                                       if self.is_root() else None)
        for group, settings in zip(optimizer.param_groups, layout["groups"], strict=True):
            group.update(settings)
        for param, entries in zip(params, layout["states"], strict=True):
            state = optimizer.state[param]
            for key in set(state) - set(entries):
                del state[key]
            for key, entry in sorted(entries.items()):
                if entry[0] == "value":
                    state[key] = entry[1]
                    continue
                _, shape, dtype, on_param_device = entry
                mine = state.get(key)
                if not (torch.is_tensor(mine) and mine.shape == shape and mine.dtype == dtype):
                    mine = state[key] = torch.empty(  # AdamW keeps its step count on the CPU
                        shape, dtype=dtype, device=param.device if on_param_device else "cpu")
                wire = self._wire(mine)
                td.broadcast(wire, src=0)
                if wire is not mine:
                    mine.copy_(wire)

    def shutdown(self) -> None:
        if self.launched and td.is_initialized():
            td.barrier()  # no rank tears down while its peer still talks to it
            td.destroy_process_group()

    def threads_outlive_shutdown(self) -> bool:
        return self.launched  # Gloo's threads (NCCL's not checked): distributed.exit_process


def remove_torchrun_log_folders(env) -> None:
    """torchrun without --log-dir (TorchDistributor passes none) makes a torchelastic_* folder
    in the temporary folder, with a folder per rank below it for a failure's error.json, and
    never removes it: every run left an empty tree in each executor's /tmp. As it exits (its
    exit handlers run, distributed.exit_process included) each rank removes its own folder and
    then each parent that is empty; the last rank out removes the tree. A folder with a file in
    it (a failure's error.json, a log) stays, and so does everything under a --log-dir the user
    chose."""
    error_file = env.get("TORCHELASTIC_ERROR_FILE")  # ROOT/RUN_xxx/attempt_N/LOCAL_RANK/error.json
    if not error_file:
        return
    rank_folder = Path(error_file).parent
    folders = [rank_folder, *rank_folder.parents[:3]]
    root = folders[-1]
    if not (root.name.startswith("torchelastic_")
            and root.parent.resolve() == Path(tempfile.gettempdir()).resolve()):
        return
    remove_empty_folders(folders)  # a peer's folder, or a file torchrun keeps, stops it
