"""Run under `horovodrun -np 2`: rank 1 starts its backward late; rank 0 waits for the gradient
allreduce with dist.synchronize_gradients and reports its wall time, its own CPU time while
waiting, and whether the gradients came back averaged (a JSON line starting with SYNCWAIT)."""

import json
import sys
import time

import torch

from hvd_ctsm import distributed as dist

LATE_S = 0.5


def main(sleeping_wait: bool) -> int:
    dist.init(threads_per_rank=1)
    model = torch.nn.Linear(4, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    optimizer = dist.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    # d(sum(w . x))/dw = x; rank r feeds x = r + 1, so the averaged gradient is 1.5 everywhere.
    x = torch.full((1, 4), float(dist.rank() + 1))
    model(x).sum().backward()  # a first round, so no first-call cost lands in the timed wait
    dist.synchronize_gradients(optimizer, sleeping_wait)
    optimizer.zero_grad()
    dist.allreduce_sum(torch.zeros(1), name="align")  # both ranks leave this together
    if dist.rank() == 1:
        time.sleep(LATE_S)
    model(x).sum().backward()
    wall, cpu = time.perf_counter(), time.thread_time()
    dist.synchronize_gradients(optimizer, sleeping_wait)
    report = {"rank": dist.rank(), "wait_s": time.perf_counter() - wall,
              "wait_cpu_s": time.thread_time() - cpu,
              "grad": model.weight.grad.flatten().tolist()}
    print("SYNCWAIT " + json.dumps(report), flush=True)
    with optimizer.skip_synchronize():
        optimizer.step()
    dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] == "sleep"))
