"""A worker for test_torch_backend's sparse comm hook test: under torchrun (Gloo, a CPU), two
copies of one model with a sparse embedding, one under DDP's own sparse allreduce, the other
under sparse_allgather_hook (what a GPU's NCCL runs, which has no sparse allreduce), go through
the same steps; each rank writes both copies' averaged gradients, every step, to argv[1]."""

import json
import sys
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from hvd_ctsm import distributed as dist
from hvd_ctsm.distributed.torch_backend import sparse_allgather_hook


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.item = torch.nn.Embedding(50, 4, sparse=True)
        self.out = torch.nn.Linear(4, 1)

    def forward(self, ids):
        return self.out(self.item(ids)).square().sum()


folder = Path(sys.argv[1])
backend = dist.start("torch", threads_per_rank=1)
rank = backend.rank()
nets = []
for hooked in (False, True):
    torch.manual_seed(0)
    net = DistributedDataParallel(Model())
    if hooked:
        net.register_comm_hook(None, sparse_allgather_hook)
    nets.append(net)
generator = torch.Generator().manual_seed(10 + rank)  # each rank its own rows, some shared
steps = []
for step in range(3):
    ids = torch.randint(0, 50, (7 + 5 * rank + step,), generator=generator)  # uneven counts
    grads = []
    for net in nets:
        net.zero_grad(set_to_none=True)
        net(ids).backward()
        item = net.module.item.weight.grad
        grads.append({"item_sparse": item.is_sparse, "item": item.to_dense().tolist(),
                      "out": net.module.out.weight.grad.tolist()})
    steps.append(grads)
(folder / f"rank-{rank}.json").write_text(json.dumps(steps))
backend.shutdown()
dist.exit_process(0)
