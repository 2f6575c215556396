"""./run.sh's launchers, torchrun and horovodrun, run in this process so that a run whose workers
failed ends in one line and the exit code of hvd_ctsm/errors.py's table, not in the launcher's
traceback (38 lines from torchrun, 27 from horovodrun) and its exit 1 for any failure.

    python -m hvd_ctsm.distributed.launchers torchrun --standalone --nproc-per-node 2 ...
    python -m hvd_ctsm.distributed.launchers horovodrun -np 2 --gloo ...

Each worker that fails writes its own code into a folder of this host named by EXIT_CODE_DIR
(errors.record_exit_code). The run exits 2 where a worker was given bad input (the other ranks'
lost peer follows from it), 1 where one was refused, else 3: a crash, a rank killed (by the
kernel's OOM killer, say), or workers on other hosts, whose folders are theirs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

from hvd_ctsm.errors import EXIT_BAD_INPUT, EXIT_CODE_DIR, EXIT_CRASH, EXIT_REFUSED, LAUNCHER_SIGNAL

# horovodrun's error when a worker exited non-zero (static and elastic runs alike).
HOROVOD_WORKER_FAILED = "processes exited with non-zero status"
MEANING = {EXIT_REFUSED: "refused", EXIT_BAD_INPUT: "bad input", EXIT_CRASH: "crashed"}


class WorkersFailed(Exception):
    """The launcher ended because a worker exited non-zero."""


class Stopped(Exception):
    """The launcher was stopped by a signal (Ctrl-C's SIGINT, a scheduler's SIGTERM)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def launch(launcher: str, argv: list[str]) -> int:
    """Run `launcher` (torchrun or horovodrun) with `argv`; 0, or the code its workers mean."""
    codes = Path(tempfile.mkdtemp(prefix="hvd_ctsm-exit-codes-"))
    os.environ[EXIT_CODE_DIR] = str(codes)
    if launcher == "torchrun" and not any(a.startswith(("--log-dir", "--log_dir")) for a in argv):
        # its per-run folder of worker logs, which it leaves in the temp folder: ours goes
        argv = ["--log-dir", str(codes / "torchrun-logs"), *argv]
    try:
        run_launcher(launcher, argv)
        return 0
    except Stopped as stop:  # the workers got the signal too, and said so
        print(f"{launcher}: stopped by {stop}", file=sys.stderr)
        return 128 + stop.signum  # the shell's code for it: 130 for Ctrl-C
    except WorkersFailed:
        recorded = [f.read_text().strip() for f in codes.iterdir() if f.is_file()]
        code = run_exit_code([int(text) for text in recorded if text.isdigit()])
        print(f"{launcher}: a worker stopped: {MEANING[code]} (exit {code}); its message is "
              "above", file=sys.stderr)
        return code
    finally:
        shutil.rmtree(codes, ignore_errors=True)


def run_exit_code(recorded: list[int]) -> int:
    """The run's exit code from the codes its failed workers wrote: bad input is the cause the
    other ranks' lost peer follows from, a refusal next; nothing written is a crash or a kill."""
    for code in (EXIT_BAD_INPUT, EXIT_REFUSED):
        if code in recorded:
            return code
    return EXIT_CRASH


def run_launcher(launcher: str, argv: list[str]) -> None:
    """The launcher's own command line, in this process; WorkersFailed when a worker failed."""
    if launcher == "torchrun":
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import main

        try:
            with signals_recorded([]):  # its handlers SIGTERM the workers: they are told why
                main(argv)
        except ChildFailedError:
            raise WorkersFailed from None
        except SignalException as exc:
            raise Stopped(exc.sigval) from None
    elif launcher == "horovodrun":
        from horovod.runner.launch import run_commandline

        sys.argv = ["horovodrun", *argv]  # horovodrun reads its own sys.argv
        received: list[int] = []
        hide_gone_workers()  # this process only runs horovodrun, then exits
        quiet_middlemen()
        try:
            with signals_recorded(received):
                run_commandline()
        except KeyboardInterrupt:
            raise Stopped(signal.SIGINT) from None
        except RuntimeError as exc:
            if HOROVOD_WORKER_FAILED not in str(exc):
                raise
            # On Ctrl-C horovodrun SIGTERMs its workers, then reports them as failed.
            raise (Stopped(received[0]) if received else WorkersFailed()) from None
    else:
        raise SystemExit(f"error: launcher {launcher!r}: use torchrun or horovodrun")


@contextlib.contextmanager
def signals_recorded(received: list[int]):
    """While inside, every handler installed for SIGINT or SIGTERM (the launchers install their
    own, which stop the workers) first appends the signal to `received` and notes it for the
    workers (note_launcher_signal)."""
    install = signal.signal

    def recording(signum, handler):
        if signum in (signal.SIGINT, signal.SIGTERM) and callable(handler):
            inner = handler

            def handler(num, frame):
                received.append(num)
                note_launcher_signal(num)
                return inner(num, frame)
        return install(signum, handler)

    signal.signal = recording
    try:
        yield
    finally:
        signal.signal = install


def hide_gone_workers() -> None:
    """From now on in this process, a thread's psutil.NoSuchProcess is not printed. horovodrun
    stops its workers from threads (safe_shell_exec) that ask psutil for a worker's children; a
    worker that has already exited raises there, and the thread's traceback (16 lines) stood in
    a Ctrl-C's one line. A worker gone is what the stop wanted. For the rest of the process, not
    only while horovodrun runs: its stopping threads go on after it returns, as this process
    exits (CI here: a traceback once the hook, then only around horovodrun, was gone)."""
    import psutil

    previous = threading.excepthook

    def hook(args):
        if not issubclass(args.exc_type, psutil.NoSuchProcess):
            previous(args)

    threading.excepthook = hook


def quiet_middlemen() -> None:
    """horovodrun starts each worker's command from a middleman process (Horovod's
    safe_shell_exec) made by multiprocessing's 'spawn', so without this process's hook: its
    thread that stops the worker's shell asks psutil for the children of a shell that has just
    exited, and its psutil.NoSuchProcess traceback stood among a Ctrl-C's lines (CI, twice in
    four runs, after hide_gone_workers: "Exception in thread Thread-1 (fn)", safe_shell_exec.py
    line 48). The middleman now starts through middleman_without_gone_workers, which hides them
    there too. Horovod 0.28.1 looks the target up by this module-level name at each start."""
    from horovod.runner.common.util import safe_shell_exec

    if safe_shell_exec._exec_middleman is not middleman_without_gone_workers:
        safe_shell_exec._exec_middleman = middleman_without_gone_workers


def middleman_without_gone_workers(*args) -> None:
    """In the spawned middleman (a fresh interpreter: its safe_shell_exec is Horovod's own)."""
    from horovod.runner.common.util import safe_shell_exec

    hide_gone_workers()
    safe_shell_exec._exec_middleman(*args)


def note_launcher_signal(signum: int) -> None:
    """Tell the workers, before the launcher stops them, which signal stopped it."""
    folder = os.environ.get(EXIT_CODE_DIR)
    if folder:
        with contextlib.suppress(OSError):
            Path(folder, LAUNCHER_SIGNAL).write_text(signal.Signals(signum).name)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    sys.exit(launch(sys.argv[1], sys.argv[2:]))
