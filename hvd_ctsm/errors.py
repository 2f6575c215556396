"""One error style for every command: one line naming the problem and the fix, distinct exit codes.

The exit codes of every program (`hvd-ctsm STEP`, `python -m hvd_ctsm.*`, the feature job, the
Spark pipeline, and `./run.sh` around torchrun and horovodrun) are EXIT_CODES below.
`--debug` anywhere on a command line shows the full traceback instead of the one line.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote

EXIT_OK, EXIT_REFUSED, EXIT_BAD_INPUT, EXIT_CRASH = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # the shell's code for a command ended by SIGINT (128 + 2)
EXIT_READER_GONE = 141  # ... and by SIGPIPE (128 + 13): what reads our output stopped (| head)
EXIT_TERMINATED = 143  # ... and by SIGTERM (128 + 15): a scheduler's or a cluster manager's stop
# Set by spark_session's Ctrl-C (and SIGTERM) handler when it cancels Spark's jobs: the error the
# cancelled job's call then raises is the interruption, not a crash. TERMINATED: it was SIGTERM.
CTRL_C = threading.Event()
TERMINATED = threading.Event()
# Set by run_cli while a --debug call runs: what would only repeat an error's one line is shown
# too (Spark's log of a job that filled the disk: spark_session.spark_log_kept_back).
DEBUG = threading.Event()
EXIT_CODES = """exit codes:
  0  done
  1  refused by a gate or a check: the backtest's or gate's rule, deploy's checks; nothing is
     wrong with the inputs
  2  bad arguments or input: a bad config value, a missing or damaged dataset or model, an output
     that may not be written; the one-line message names the fix
  3  crashed: a bug or an environment problem (a full disk: its line names the path); rerun
     with --debug for the traceback
130  interrupted (Ctrl-C); a training run goes on from its last checkpoint with --resume
141  what read the output stopped reading (`| head`), as for any command the pipe stops
143  stopped by SIGTERM (a scheduler's or a cluster manager's stop): as 130 (said by the
     launchers, and by the commands that start Spark themselves)"""


def arg_parser(prog: str | None, description: str) -> argparse.ArgumentParser:
    """A program's parser, its --help ending with the exit codes."""
    return argparse.ArgumentParser(prog=prog, description=description, epilog=EXIT_CODES,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


# What the user can fix in the command line or the input (exit 2); every program catches these.
BAD_INPUT_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, KeyError, FileNotFoundError, FileExistsError, NotADirectoryError,
    IsADirectoryError, PermissionError)


class Terminated(KeyboardInterrupt):
    """SIGTERM's stop, raised where Ctrl-C's KeyboardInterrupt is: the same way out (finally
    blocks, a stage removed), then its own line and exit 143 (run_cli)."""


def stop_said(stop: KeyboardInterrupt) -> str:
    """What a stop is called in a line or a record: by SIGTERM, or by Ctrl-C."""
    return "stopped by SIGTERM" if isinstance(stop, Terminated) else "interrupted"


def exit_code_for(exc: BaseException) -> int:
    """2 for what the user can fix in the command line or the input, else 3."""
    return EXIT_BAD_INPUT if isinstance(exc, BAD_INPUT_ERRORS) else EXIT_CRASH


def one_line(exc: BaseException) -> str:
    """The exception as one line, with the fix for the usual file-system causes."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, PermissionError):
        return f"cannot write or read {exc.filename or ''}: permission denied; pick a path " \
               "you can write to (or fix its permissions)"
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"{exc.filename} not found; check the path"
    if isinstance(exc, KeyError):
        return f"missing field {text} in an input file; is it the right file?"
    return text


# torchrun and horovodrun exit 1 whatever their workers' codes were. ./run.sh's launchers
# (hvd_ctsm.distributed.launchers) name a folder in this variable for the workers they start;
# each one that fails writes its code there, and the run exits with the code they mean.
EXIT_CODE_DIR = "HVD_CTSM_EXIT_CODE_DIR"
# ... and where the launcher itself was stopped (Ctrl-C), the signal's name, in this file of it
# before the launcher stops its workers: they then say so rather than guess at a failed rank.
LAUNCHER_SIGNAL = "launcher-signal"


class Explained(RuntimeError):
    """A failure whose message says all that is known of it (another rank gone): its traceback
    would show only where this process learned of it."""


class AnotherRankFailed(RuntimeError):
    """This rank stopped because another one failed first and said why (its own line): one
    line pointing at it, exit 3, neither "crashed" nor a guess at the cause."""


def another_rank_failed(wait_s: float = 0.0) -> bool:
    """Whether another worker of this host has written a failed code (record_exit_code) into
    the launcher's EXIT_CODE_DIR, waiting up to `wait_s` for it: a lost peer is seen as the
    failed worker's process exits, just after it writes. False without ./run.sh's launchers,
    and for a rank killed (SIGKILL writes nothing) or on another host."""
    folder = os.environ.get(EXIT_CODE_DIR)
    deadline = time.monotonic() + wait_s
    while folder:
        try:
            if any(name.isdigit() and name != str(os.getpid()) for name in os.listdir(folder)):
                return True
        except OSError:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return False


def launcher_stopped_by() -> str | None:
    """The signal that stopped this worker's launcher (SIGINT for Ctrl-C), if one did."""
    folder = os.environ.get(EXIT_CODE_DIR)
    try:
        return Path(folder, LAUNCHER_SIGNAL).read_text().strip() if folder else None
    except OSError:
        return None


def record_exit_code(code: int) -> int:
    """Leave a failed `code` where the launcher's caller reads it (EXIT_CODE_DIR); `code`."""
    folder = os.environ.get(EXIT_CODE_DIR)
    if code and folder:
        try:
            with open(os.path.join(folder, str(os.getpid())), "w") as out:
                out.write(f"{code}\n")
        except OSError:  # the code still goes to the launcher; the run then says 3
            pass
    return code


# What run_cli said on stderr in this process, in order: a rank that Spark started returns its
# line to the driver, which says it (hvd_ctsm.train.spark_train), where no one reads the rank's.
SAID: list[str] = []


def say(line: str) -> None:
    """One of run_cli's lines for the user, on stderr and kept in SAID."""
    SAID.append(line)
    print(line, file=sys.stderr)


def run_cli(main: Callable[[list[str]], int], prog: str, argv: list[str] | None = None,
            crash_traceback: bool = False) -> int:
    """Run `main(argv)`: exit code from it, or one line on stderr and 2 (bad input, permission)
    or 3 (anything else), recorded for ./run.sh's launchers (record_exit_code). `--debug` in
    argv lets the traceback through. `crash_traceback`: a crash's traceback goes on stderr
    before its line, for a process no one can start again with --debug (a rank Spark started)."""
    try:
        return record_exit_code(_run_cli(main, prog, argv, crash_traceback))
    except SystemExit as stop:  # argparse's exit 2, a program's sys.exit(N)
        if isinstance(stop.code, int):
            record_exit_code(stop.code)
        raise
    except Exception as exc:  # let through by --debug: the code it means is recorded still
        record_exit_code(exit_code_for(exc))
        raise


def _run_cli(main: Callable[[list[str]], int], prog: str, argv: list[str] | None,
             crash_traceback: bool) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if debug:  # for this call only: a notebook's next call without --debug is not one
        DEBUG.set()
        try:
            return main(argv)
        finally:
            DEBUG.clear()
    threads_said: list[str] = []
    try:
        with disk_full_in_threads(prog) as threads_said:
            code = main(argv)
        return EXIT_CRASH if threads_said and code == EXIT_OK else code  # said "error:"
    except BrokenPipeError:  # `... --help | head`: no failure of ours, so no line ("crashed")
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # exit's flush: no error
        return EXIT_READER_GONE
    except BAD_INPUT_ERRORS as exc:
        say(f"{prog}: error: {one_line(exc)}")
        return EXIT_BAD_INPUT
    except SystemExit as stop:  # SystemExit("error: ...") is a message for the user
        if isinstance(stop.code, str):  # under the program's name, as its other errors
            named = stop.code.startswith("error:")
            say(f"{prog}: {stop.code}" if named else stop.code)
            return EXIT_BAD_INPUT
        raise
    except KeyboardInterrupt as stop:  # Ctrl-C: its own message where a step gave one
        return interrupted(prog, stop)
    except AnotherRankFailed as follower:  # the first rank's line says why
        say(f"{prog}: error: {follower}")
        return EXIT_CRASH
    except Exception as exc:  # noqa: BLE001  one line; --debug shows the traceback
        stop = ctrl_c_stop()
        if stop:  # a Spark job cancelled by Ctrl-C: its call's error is the stop
            return interrupted(prog, stop)
        full = disk_full(exc)
        if full:  # the cause is known: no "crashed", no --debug to find it
            say(f"{prog}: error: {full}")
            threads_said.clear()
            return EXIT_CRASH
        detail = spark_jvm_stopped(exc) or f"{type(exc).__name__}: {one_line(exc)}"
        if not crash_traceback:
            detail += " (rerun with --debug for the traceback)"
        elif not isinstance(exc, Explained):
            traceback.print_exc()
            detail += " (its traceback is above it)"
        say(f"{prog}: crashed: {detail}")
        return EXIT_CRASH
    finally:
        for line in threads_said:  # a thread's full disk that the main thread did not say
            say(line)


def ctrl_c_stop() -> KeyboardInterrupt | None:
    """The stop to raise or say instead of an error when Ctrl-C's handler has cancelled Spark's
    jobs (CTRL_C): the failed call's error is their cancelling. None without a Ctrl-C. After a
    SIGTERM that the same handler took (TERMINATED), the stop is Terminated."""
    if TERMINATED.is_set():
        return Terminated("stopped by SIGTERM: Spark's running jobs were cancelled")
    if CTRL_C.is_set():
        return KeyboardInterrupt("interrupted: Spark's running jobs were cancelled")
    return None


def interrupted(prog: str, stop: KeyboardInterrupt) -> int:
    """Ctrl-C's (or SIGTERM's) one line and exit code. As the interpreter does for an uncaught
    exception, the stop is left for exit hooks to read (an open MLflow run ends KILLED, not
    FAILED: hvd_ctsm.tracking.runs.end_open_runs)."""
    say(f"{prog}: {str(stop) or stop_said(stop)}")
    sys.last_type, sys.last_value = type(stop), stop
    return EXIT_TERMINATED if isinstance(stop, Terminated) else EXIT_INTERRUPTED


# A full disk (or quota) is the environment, not the command or its input: exit 3, as for a
# crash, since the same command works once there is room; but its line says so and names where.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded")
# Where Spark's writer says it failed: "Task failed while writing rows to file:/a/b."
SPARK_WRITE_TARGET = re.compile(r"writing rows to (?:file:)?(\S+?)\.?(?:\s|$)")
# An output built in a temporary sibling (hvd_ctsm.files.outputs.staging_dir) is named as the
# output the user gave: the stage is gone by the time the line is read.
STAGE = re.compile(r"/\.([^/]+)\.tmp-[0-9a-f]{8}(?=/|$)")
AGAIN = "run the command again"  # the way on, unless the step names another (NoSpaceError)


class NoSpaceError(OSError):
    """A full disk, said with the way on for this command (`then`)."""

    def __init__(self, code: int, strerror: str, filename: str, then: str = AGAIN):
        super().__init__(code, strerror, filename)  # OSError's arguments: it pickles as one
        self.then = then

    @classmethod
    def of(cls, full: OSError, path: str | os.PathLike, then: str) -> NoSpaceError:
        """`full` with the way on; `path` where it names no file (a thread's write)."""
        return cls(full.errno, full.strerror, os.fspath(full.filename2 or full.filename or path),
                   then)


def disk_full(exc: BaseException) -> str | None:
    """The one line, naming the path where known, when `exc` (or one it was raised from or
    during) is a full disk: an OSError of ours, or Spark's error text via Py4J; else None."""
    texts, seen = [], exc
    while seen is not None and len(texts) < 10:
        if isinstance(seen, OSError) and seen.errno in DISK_FULL:
            # shutil.copyfile and os.replace name the source first, the written file second
            return no_space_line(seen.filename2 or seen.filename, seen.strerror,
                                 getattr(seen, "then", AGAIN))
        texts.append(str(seen))
        # a context raised `from None` was put aside on purpose: not this error's cause
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    for said in DISK_FULL_TEXTS:
        if any(said in text for text in texts):
            target = next(filter(None, map(SPARK_WRITE_TARGET.search, texts)), None)
            return no_space_line(target and unquote(target.group(1)), said)  # a URL's %20
    return None


@contextmanager
def disk_full_in_threads(prog: str) -> Iterator[list[str]]:
    """Collect, as their one lines, the full disks that end threads (TensorBoard's writer):
    Python printed each one's traceback, cut off at exit ("Exception in thread Thread-1:" in
    the middle of the command's line). The thread's writer raises it in the main thread too,
    whose line names the folder: the collected ones are for a main thread that never said so."""
    previous, said = threading.excepthook, []

    def hook(args) -> None:
        full = args.exc_value is not None and disk_full(args.exc_value)
        if not full:
            previous(args)
        elif f"{prog}: error: {full}" not in said:
            said.append(f"{prog}: error: {full}")

    threading.excepthook = hook
    try:
        yield said
    finally:
        threading.excepthook = previous


def no_space_line(path: str | os.PathLike | None, strerror: str | None,
                  then: str = AGAIN) -> str:
    """The line for a full disk, naming `path` where it is known."""
    said = (strerror or "No space left on device").lower()
    if not path:
        return (f"{said} while writing (the output's disk, or TMPDIR's or Spark's "
                "spark.local.dir, which are /tmp by default): free space there or write "
                f"elsewhere, then {then}")
    path = STAGE.sub(r"/\1", os.fsdecode(path))
    return (f"{said} writing {path}: free space on its disk (df -h shows how much) or write "
            f"elsewhere, then {then}")


SPARK_MEMORY_FIX = ("give it more heap: --conf spark.driver.memory=16g (in local mode the "
                    "driver runs every task; the feature job sizes it by its input, 4g at least), "
                    "spark.executor.memory on a cluster; or fewer events per run")


def spark_jvm_stopped(exc: BaseException) -> str | None:
    """The one line, with the fix, when Spark's JVM ran out of memory or stopped mid-job (said
    by the exception or one it was raised from or during), instead of Java's stack trace (a
    5x10^7-event feature job printed 4,000 characters of it, not saying "memory"); else None.
    The JVM's own OutOfMemoryError is in its log; the job's Python sees a failed action or a
    stopped SparkContext."""
    texts, seen = [], exc
    while seen is not None and len(texts) < 10:
        texts.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    if any("java.lang.OutOfMemoryError" in text for text in texts):
        return f"the Spark JVM ran out of memory (java.lang.OutOfMemoryError); {SPARK_MEMORY_FIX}"
    if any("stopped SparkContext" in text or "SparkContext was shut down" in text
           for text in texts):
        return ("the Spark JVM stopped mid-job, most often out of memory (look for "
                f"java.lang.OutOfMemoryError in the log above); {SPARK_MEMORY_FIX}")
    return None
