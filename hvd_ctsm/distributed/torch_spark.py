"""Training on Spark's TorchDistributor (dist.backend=torch on Spark): its run, the driver's view
of the torchrun agents' output, and a failed rank's line for the rank whose result comes back.

TorchDistributor returns one rank's result (rank 0's task's; in local_mode the last torchrun
worker's to write it). When another rank failed first, that rank only saw its peer go ("another
rank failed first"), and the line that says why stayed in the failed rank's executor log. A
failed rank leaves its line in the store that torchrun's agents serve, which outlives the
workers, and a rank that followed it takes it back with its own result.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as td


def spark_run(fn, args: tuple = (), num_proc: int = 2, local_mode: bool = False,
              use_gpu: bool = False):
    """Run fn(*args) in `num_proc` torchrun workers started by Spark's TorchDistributor; returns
    rank 0's result. local_mode=False: one worker per Spark task (a barrier stage on the
    executors); True: all of them on the driver's host."""
    from pyspark.ml.torch.distributor import TorchDistributor

    distributor = TorchDistributor(num_processes=num_proc, local_mode=local_mode,
                                   use_gpu=use_gpu)
    # The driver prints the torchrun agents' output: to stderr from the executors' tasks, to
    # stdout in local_mode.
    with exit_barrier_race_unsaid(sys, "stderr"), exit_barrier_race_unsaid(sys, "stdout"):
        return distributor.run(fn, *args)


# torchrun's agents meet at an exit barrier once their workers are done, on a store that the
# first node's agent serves. That agent leaves as soon as the last one has arrived, and the last
# one's own wait can then find the store gone: it logs "Error waiting on exit barrier" and a
# traceback, then ends as it would have (torch's open issue 69520). Every worker had already
# finished, so the block says nothing about the run, and after a rank's one-line error it read
# as a crash. Each line of it carries the same "E1202 07:22:37.391000 13414 .../api.py:1008]".
_EXIT_BARRIER_ERROR = re.compile(r"^(E\d{4} [\d:.]+ +\d+ \S+:\d+\] )Error waiting on exit barrier")


class _WithoutExitBarrierRace:
    """A text stream that passes every write on except the exit barrier race's lines."""

    def __init__(self, stream):
        self._stream = stream
        self._dropping = None  # the prefix of the block being dropped

    def write(self, text: str) -> int:
        if not text.endswith("\n"):  # a partial line (a progress bar): not the agents' log
            self._dropping = None
            return self._stream.write(text)
        kept = []
        for line in text.splitlines(keepends=True):
            block = _EXIT_BARRIER_ERROR.match(line)
            if block:
                self._dropping = block.group(1)
            elif not (self._dropping and line.startswith(self._dropping)):
                self._dropping = None
                kept.append(line)
        if kept:
            self._stream.write("".join(kept))
        return len(text)

    def __getattr__(self, name):  # flush, fileno, encoding, isatty...: the stream's own
        return getattr(self._stream, name)


@contextmanager
def exit_barrier_race_unsaid(module, name: str):
    """module.name (sys.stderr) without the exit barrier race's block while the block runs."""
    stream = getattr(module, name)
    setattr(module, name, _WithoutExitBarrierRace(stream))
    try:
        yield
    finally:
        setattr(module, name, stream)


FAILED_KEY = "hvd_ctsm/failed/rank-{}"


def _agents_store(timeout_s: float) -> td.TCPStore:
    """A client of the store torchrun's agents serve (MASTER_ADDR/PORT in a torchrun worker)."""
    return td.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                       is_master=False, timeout=timedelta(seconds=timeout_s))


def leave_failure(result: dict) -> None:
    """A failed rank's result (its rank, exit code and line), for a rank that followed it.
    Left before the process ends, so before a peer can see it gone; best effort (its own
    stderr has the line)."""
    try:
        _agents_store(10).set(FAILED_KEY.format(result["rank"]), json.dumps(result))
    except Exception:  # noqa: BLE001  the store unreachable: the line stays in its log only
        pass


def failures_before(rank: int, world_size: int, wait_s: float = 5.0) -> list[dict]:
    """The results other ranks left (leave_failure), waiting up to wait_s for the first: a rank
    killed outright (out of memory) leaves none."""
    try:
        store = _agents_store(wait_s)
        keys = [FAILED_KEY.format(other) for other in range(world_size) if other != rank]
        deadline = time.monotonic() + wait_s
        found = [key for key in keys if store.check([key])]
        while not found and time.monotonic() < deadline:
            time.sleep(0.2)
            found = [key for key in keys if store.check([key])]
        return [json.loads(store.get(key)) for key in found]
    except Exception:  # noqa: BLE001  the store gone with its agent: this rank's line stands
        return []
