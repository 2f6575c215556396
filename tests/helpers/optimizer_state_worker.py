"""A worker for test_torch_backend's optimizer-state test: under torchrun, rank 0 holds a state
that differs from the others' in every way a resume can give (other settings, more steps, a key
the others lack, a plain value, a tensor of another dtype), rank 1 one with a key rank 0 lacks.
After broadcast_state each rank writes what its state is, in full, to folder argv[1]."""

import json
import sys
from pathlib import Path

import torch

from hvd_ctsm import distributed as dist
from hvd_ctsm.distributed.base import create_optimizer_state


def described(optimizer) -> dict:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = [{key: (repr(value.dtype), list(value.shape), value.flatten().tolist(),
                    str(value.device))
              if torch.is_tensor(value) else value
              for key, value in sorted(optimizer.state[p].items())} for p in params]
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return {"groups": groups, "state": state,
            "weights": [p.detach().flatten().tolist() for p in params]}


folder = Path(sys.argv[1])
backend = dist.start("auto", threads_per_rank=1)
rank = backend.rank()
torch.manual_seed(0)
model = torch.nn.Linear(3, 2)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
if rank == 0:  # as if it had read a checkpoint
    optimizer.param_groups[0]["lr"] = 0.003
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()
    optimizer.state[model.weight]["extra"] = torch.arange(5, dtype=torch.float64)
    optimizer.state[model.bias]["note"] = 7
else:
    create_optimizer_state(optimizer)
    optimizer.state[model.weight]["stale"] = torch.ones(4)
    optimizer.state[model.bias]["exp_avg"] = torch.zeros(2, dtype=torch.float64)
(folder / f"before-{rank}.json").write_text(json.dumps(described(optimizer)))
backend.broadcast_state(model, optimizer)
(folder / f"after-{rank}.json").write_text(json.dumps(described(optimizer)))
backend.shutdown()
dist.exit_process(0)
