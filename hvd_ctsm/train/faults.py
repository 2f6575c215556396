"""Seeing faults while training runs: slow ranks, Horovod stall warnings, an injected delay.

- `step_time_report` turns every rank's step times (gathered to rank 0 at each log step) into a
  record that names the slowest rank, so a straggler is reported by rank in train_log.jsonl.
- `StallWatcher` copies rank 0's stderr through a pipe and turns Horovod's stall inspector
  warnings (HOROVOD_STALL_CHECK_TIME_SECONDS; the C++ core prints them to stderr) into records in
  our own log: events.jsonl in the run folder, and the trainer's logger.
- `delayed` is a fault-injection knob for tests and drills only: the trainer setting
  `debug.step_delay_s` ('{"1": 0.5}', or '{"*": 0.1}' for every rank) makes those ranks sleep
  that long before each batch they read, inside the trainer's timed data phase. Empty, the
  batches pass through untouched.
- `note_on_sigterm` prints one line saying why before a SIGTERM ends the process: the launchers
  send it to every rank left when one fails (a rank killed for memory), often before the
  transport has told the survivor its peer has gone.
- `peer_loss_reported` turns the transport's error for a rank that has gone into PeerLostError,
  whose message gives this run's catalog size and the settings that bound a rank's memory.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from hvd_ctsm import distributed as dist
from hvd_ctsm.errors import AnotherRankFailed, Explained, another_rank_failed, launcher_stopped_by
from hvd_ctsm.files.atomic import append_line

if TYPE_CHECKING:
    from hvd_ctsm.config import TrainConfig
    from hvd_ctsm.model.ctsm import CTSM

log = logging.getLogger("hvd_ctsm.train.faults")
PROG = "hvd-ctsm train"  # the trainer's one-line messages start with it, as its errors do
STARTED_BY = "HVD_CTSM_RANK_STARTED_BY"  # "spark" in a rank that Spark started (spark_train)
# A rank whose busy time per step is this many times the median is called slow in the log.
SLOW_FACTOR = 1.5
_STALL_START = re.compile(r"waiting for remainder of ranks for more than|is stalled for longer")
_stderr_tee = None  # rank 0's StallWatcher while it copies fd 2 (start_stall_watcher)


def delayed(batches: Iterator, rank: int, step_delay_s: dict[str, float]) -> Iterator:
    """`batches`, each one after this rank's injected delay (debug.step_delay_s: by rank, or '*'
    for all); the same iterator when it has none."""
    seconds = step_delay_s.get(str(rank), step_delay_s.get("*", 0.0))
    if not seconds:
        return batches
    return (time.sleep(seconds) or batch for batch in batches)


def step_time_report(busy_by_rank: list[float], wait_by_rank: list[float]) -> dict:
    """Per-rank mean seconds per step: busy (data, forward, backward, step) and allreduce wait.

    In synchronous data parallelism the fast ranks wait in the allreduce for the slow one, so the
    straggler is the rank with the most busy time, not the most total time."""
    median = statistics.median(busy_by_rank)
    slowest = max(range(len(busy_by_rank)), key=busy_by_rank.__getitem__)
    slow = [r for r, busy in enumerate(busy_by_rank)
            if len(busy_by_rank) > 1 and busy > SLOW_FACTOR * max(median, 1e-6)]
    return {"busy_s_by_rank": [round(b, 5) for b in busy_by_rank],
            "wait_s_by_rank": [round(w, 5) for w in wait_by_rank],
            "slowest_rank": slowest, "slow_ranks": slow}


def append_event(out: Path, event: dict) -> None:
    """One line in the run's events.jsonl (rank 0 only): faults seen and recoveries made."""
    append_line(Path(out) / "events.jsonl", json.dumps({"time": time.time()} | event))


class StallWatcher:
    """Tee this process's stderr (fd 2) through a pipe; Horovod stall warnings become events.

    Only rank 0 runs it: Horovod's coordinator (rank 0) is the one that prints them. The copy to
    the original stderr keeps everything a user would have seen."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self.stalls = 0
        self._pending: list[str] | None = None
        self.original_fd = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
        self._thread = threading.Thread(target=self._pump, args=(read_end,), daemon=True,
                                        name="stall-watcher")
        self._thread.start()

    def _pump(self, read_end: int) -> None:
        pending = b""
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                os.write(self.original_fd, chunk)
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._inspect(line.decode(errors="replace"))

    def _inspect(self, line: str) -> None:
        """A stall warning is one matching line plus a few (`Missing ranks:`, `1: [names]`)."""
        if self._pending is not None:
            self._pending.append(line.strip())
            if len(self._pending) >= 4:
                self._record()
        elif _STALL_START.search(line):
            self._pending = [line.strip()[-300:]]

    def _record(self) -> None:
        lines, self._pending = self._pending, None
        self.stalls += 1
        missing = [int(m.group(1)) for text in lines if (m := re.match(r"^\D*?(\d+): \[", text))]
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            append_event(self.out, {"event": "horovod_stall_warning", "missing_ranks": missing,
                                    "text": " | ".join(lines)})
        except OSError:
            pass
        # Written to the original stderr, not through the pipe: no echo of our own line.
        os.write(self.original_fd, f"[hvd_ctsm] Horovod stall warning #{self.stalls} (missing "
                                   f"ranks {missing}) recorded in {self.out / 'events.jsonl'}\n"
                                   .encode())

    def close(self) -> None:
        """Give fd 2 back and let the pump drain what is left."""
        global _stderr_tee
        os.dup2(self.original_fd, 2)
        _stderr_tee = None
        self._thread.join(timeout=2)
        if self._pending is not None:
            self._record()


RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def start_stall_watcher(out: Path) -> StallWatcher | None:
    """On rank 0 of a horovodrun/mpirun launch (known from the environment before init; Gloo or
    MPI), else None. Seen with Horovod 0.28.1 here: the MPI controller prints stall warnings,
    the Gloo controller printed none (the per-rank step times still name a slow rank)."""
    global _stderr_tee
    ranks = [os.environ[name] for name in RANK_VARIABLES if name in os.environ]
    if not ranks or ranks[0] != "0":
        return None
    _stderr_tee = StallWatcher(out)
    return _stderr_tee


@contextmanager
def note_on_sigterm(message: Callable[[], str]) -> Iterator[None]:
    """While inside: a SIGTERM first writes `message()` to stderr, then ends the process
    as SIGTERM always did (the launcher sees the same exit, -15). Only where SIGTERM still has
    its default action, in the main thread (Python takes signals nowhere else): a notebook's
    or a Spark worker's own handler is left alone."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def say_then_stop(signum: int, frame) -> None:
        # The line goes to the real stderr: a stall watcher's pipe would die with the process.
        fd = _stderr_tee.original_fd if _stderr_tee else 2
        os.write(fd, f"{message()}\n".encode())
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, say_then_stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


# What Gloo (torch and Horovod) and Horovod say when the rank at the other end has gone.
PEER_LOST = ("closed by peer", "reset by peer", "Broken pipe", "has been shut down")


# A rank that fails writes its code (./run.sh's launchers) just before its process exits, which
# is when the others lose it: they wait this long for it before guessing at a kill for memory.
PEER_RECORD_WAIT_S = 3.0
FOLLOWED = "another rank failed first (its error is above); this one stopped with it"
LOST_A_PEER = "another rank stopped while this one was exchanging with it"


class PeerLostError(Explained):
    """Another rank vanished while this one exchanged with it (a step's gradients, the logged
    losses, a validation, a checkpoint); the message says what to look for."""


@contextmanager
def peer_loss_reported(cfg: TrainConfig, model: CTSM) -> Iterator[None]:
    """The transport's error for a peer that has gone becomes PeerLostError. Each loop (plain and
    elastic) runs all of its epochs inside it, since a rank may die during any exchange: a step,
    the logged losses, a validation, a checkpoint (seen in CI: Gloo's 'connection reset by peer'
    reached the survivor outside a step, when only the step was wrapped)."""
    try:
        yield
    except RuntimeError as exc:
        # Under Elastic Horovod a lost peer is its HorovodInternalError, which hvd.elastic.run
        # catches to restore the last commit and go on with the ranks left: it must reach it
        # as it is (wrapped, it ended the survivor too, as the elastic test caught).
        if (dist.is_elastic_launch() or isinstance(exc, PeerLostError)
                or not any(sign in str(exc) for sign in PEER_LOST)):
            raise
        if another_rank_failed(wait_s=PEER_RECORD_WAIT_S):  # it said why: no guess at memory
            raise AnotherRankFailed(FOLLOWED) from exc
        raise PeerLostError(peer_lost_message(cfg, model, exc)) from exc


def peer_lost_message(cfg: TrainConfig, model: CTSM, exc: BaseException) -> str:
    """What a surviving rank says when the transport tells it a peer has gone."""
    first = str(exc).strip().splitlines()[0][:160]
    return (f"{LOST_A_PEER} ({first}). "
            f"{memory_advice(cfg, model)}")


def followed_another(said: str) -> bool:
    """Whether a rank's line says it stopped because another rank failed or vanished first."""
    return FOLLOWED in said or LOST_A_PEER in said


def stopped_message(cfg: TrainConfig, model: CTSM) -> str:
    """What a rank says when SIGTERM stops it: torchrun and horovodrun send it to every rank
    left as soon as one fails, often before the transport has told the survivor (seen in CI:
    torchrun ended the survivor before Gloo's 'connection closed' reached it); and horovodrun
    to every rank when Ctrl-C stops it (./run.sh's launcher notes that: launcher_stopped_by)."""
    stopped_by = launcher_stopped_by()
    if stopped_by:
        return (f"{PROG}: interrupted (the launcher was stopped by {stopped_by}); the same "
                f"command with --resume goes on from the last checkpoint in {cfg.out}")
    if another_rank_failed():  # the launcher saw it exit, after it wrote its code
        return f"{PROG}: error: {FOLLOWED}"
    if os.environ.get(STARTED_BY) == "spark":  # horovod.spark's or TorchDistributor's rank
        return (f"{PROG}: stopped by SIGTERM, which Spark's driver sends every rank when "
                "another rank fails or Ctrl-C stops the driver (its line says which). "
                + memory_advice(cfg, model))
    return (f"{PROG}: error: stopped by SIGTERM, which torchrun and horovodrun send every rank "
            "when another rank fails (and a scheduler sends when it stops the job). "
            + memory_advice(cfg, model))


def memory_advice(cfg: TrainConfig, model: CTSM) -> str:
    """A peer that vanished was most often killed for memory: this run's catalog size and the
    settings that bound a rank's memory."""
    loss = model.heads["next_item"].loss_kind if "next_item" in model.heads else "none"
    fit = ("model.loss=shared (its memory does not grow with the catalog) or a smaller "
           "data.batch_size" if loss == "full" else "a smaller data.batch_size, or fewer ranks "
           "per host")
    return ("If the launcher reports a rank killed (exit code -9, SIGKILL), it most likely ran "
            f"out of memory: this run has {model.sizes.num_items:,} items, next-item loss {loss}, "
            f"data.batch_size {cfg.data.batch_size} per rank; to fit, try {fit}")
