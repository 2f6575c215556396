"""Why a Spark session did not start: one line naming the master or setting Spark refused and the
fix, instead of Java's stack trace and "crashed".

A bad --master or --conf stops Spark at one of three points, each with its own output:
spark-submit's checks of its arguments (`--master bogus`: Java prints `Exception in thread
"main"` and a stack trace, then PySpark says its Java gateway exited), the JVM's checks of its
options (`spark.driver.memory=abc`: "Invalid maximum heap size: -Xmxabc"), and the SparkContext's
or the SQL session's start inside the JVM (`local[abc]`, `spark.ui.enabled=maybe`: a Py4J error,
and the trace Spark logs). The JVM writes to the stderr it inherits, out of this process's reach;
JvmStderr gives it a pipe instead, copied to stderr, and holds what the JVM prints until the
session is known to have started.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import re
import select
import sys
import termios
import threading
import time
from collections import deque

# Java's lines around the reason it did not start: its own closing words, warnings, the
# options it picked up from the environment (JAVA_TOOL_OPTIONS), a heading.
JAVA_PREAMBLE = ("Error: ", "WARNING: ", "Picked up ", "Error occurred during initialization")
GATEWAY_EXITED = ("JAVA_GATEWAY_EXITED", "Java gateway process exited")
MASTERS = "local[*], local[N], spark://HOST:PORT, yarn or k8s://HOST:PORT"
HOLD_S = 60.0  # a start that takes longer shows what its JVM has printed so far
PIPE_BYTES = 1 << 20  # room for the JVM's lines while this process is busy elsewhere
DELAY_BYTES = 4 << 20  # at most this much of a delayed log is held; the oldest goes on first
# Printed by every Spark 4 JVM as it starts (Spark adds the module itself): no news to a user,
# and the first line of every job's output. Dropped from what is held.
START_NOISE = (b"WARNING: Using incubator modules: jdk.incubator.vector\n",)


class SparkSettingError(ValueError):
    """Spark refused the master or a setting it was given (bad input: exit 2)."""


class SparkStartError(RuntimeError):
    """Spark did not start, for a reason its error does not put on a setting (exit 3)."""


class JavaOutput(Exception):
    """What Spark's JVM printed as the session failed to start: the cause of the one line, shown
    with --debug."""


class JvmStderr:
    """The stderr of the JVM started while this is held: a pipe whose lines go on to this
    process's stderr, held back until `release` (the session started) or dropped by `discard`
    (it did not, and the one line says why) until the next `hold`. Made before PySpark starts
    the JVM, which inherits file descriptor 2; `restore` right after, whatever happened. Where
    no JVM started (PySpark reused its gateway), the pipe closes at `restore` and the copying
    ends; the running JVM's own is held again instead (hold_jvm_stderr)."""

    def __init__(self):
        self.held, self.mode = bytearray(), "hold"
        self.delayed: deque[tuple[float, bytes]] = deque()  # (when read, chunk) in "delay"
        self.delay_s, self.delayed_bytes = 0.0, 0
        self.lock = threading.Lock()
        self.deadline = time.monotonic() + HOLD_S
        self.read, write = os.pipe()
        try:
            fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except (AttributeError, OSError):  # not Linux, or a lower limit: 64 KiB still works
            pass
        try:
            self.out = os.dup(2)
        except OSError:  # no stderr at all (2>&-): nothing to hold it from
            os.close(self.read)
            os.close(write)
            raise
        sys.stderr.flush()
        os.dup2(write, 2)  # inheritable: the JVM's stderr
        os.close(write)
        self.redirected = True
        threading.Thread(target=self._copy, name="jvm-stderr", daemon=True).start()
        # The copying thread is a daemon, stopped where it is at exit: what the JVM wrote just
        # before the end (a job's last error, a notebook's last cell) was lost 4 times in 20.
        atexit.register(self.settle, drop=False)

    def alive(self) -> bool:
        """Whether a JVM still writes to this pipe."""
        with self.lock:
            return self.read >= 0

    def hold(self) -> None:
        """Hold again what the running JVM prints: a session starts on it once more."""
        with self.lock:
            self._pass_delayed(everything=True)
            self.held.clear()
            self.mode = "hold"
            self.deadline = time.monotonic() + HOLD_S

    def restore(self) -> str:
        """This process's own stderr back; the JVM's output held so far (all it has written:
        the pipe is read empty first)."""
        with self.lock:
            if self.redirected:
                os.dup2(self.out, 2)
                self.redirected = False
        self._drain()
        with self.lock:
            return self.held.decode(errors="replace")

    def _drain(self) -> None:
        """Wait (2 s at most) until the copying thread has read all the JVM has written."""
        for _ in range(200):  # the copying thread reads under the lock
            with self.lock:
                if self._unread() == 0:
                    return
            time.sleep(0.01)

    def delay(self, seconds: float) -> None:
        """From now on, until `settle`, what the JVM prints goes on `seconds` after it came
        (spark_session.spark_log_kept_back). Only after a start: a start's hold, or a failed
        start's drop, is left as it is."""
        with self.lock:
            if self.mode == "pass":
                self.mode, self.delay_s = "delay", seconds

    def settle(self, drop: bool) -> None:
        """End `delay`: what it holds (all the JVM has written by now) goes on, or with `drop`
        is dropped; what the JVM prints next goes on at once."""
        self._drain()
        with self.lock:
            if self.mode != "delay":
                return
            if drop:
                self.delayed.clear()
                self.delayed_bytes = 0
            self._pass_delayed(everything=True)
            self.mode = "pass"

    def _pass_delayed(self, everything: bool = False) -> None:
        """The delayed chunks that are due (older than the delay, or beyond DELAY_BYTES)."""
        due = time.monotonic() - self.delay_s
        while self.delayed and (everything or self.delayed[0][0] < due
                                or self.delayed_bytes > DELAY_BYTES):
            _, chunk = self.delayed.popleft()
            self.delayed_bytes -= len(chunk)
            self._write(chunk)

    def release(self) -> None:
        with self.lock:
            self._pass()
            self._close_if_done()

    def discard(self) -> None:
        """Drop what was held and what this JVM prints until the next `hold`: its session did
        not start (the one line says why), and stopping or exiting it prints more traces."""
        with self.lock:
            self.held.clear()
            self.mode = "drop"
            self._close_if_done()

    def _pass(self) -> None:
        if self.mode == "hold":
            self.mode = "pass"
            held = bytes(self.held)
            for line in START_NOISE:
                held = held.replace(line, b"", 1)
            self._write(held)
            self.held.clear()

    def _unread(self) -> int:
        if self.read < 0:
            return 0
        try:
            return int.from_bytes(fcntl.ioctl(self.read, termios.FIONREAD, b"\0" * 4),
                                  sys.byteorder)
        except OSError:
            return 0

    def _close_if_done(self) -> None:
        """Close our copy of stderr once the JVM has exited, fd 2 is restored from it and
        nothing held is left to write."""
        if self.read < 0 and not self.redirected and self.mode != "hold" and self.out >= 0:
            os.close(self.out)
            self.out = -1

    def _copy(self) -> None:
        """Until the JVM exits: every byte read, so that the JVM never waits on a full pipe."""
        poll = select.poll()  # not select.select: it fails on a descriptor above 1023
        poll.register(self.read, select.POLLIN)
        while True:
            ready = poll.poll(500)
            with self.lock:
                if not ready:
                    if time.monotonic() > self.deadline:
                        self._pass()
                    self._pass_delayed()
                    continue
                chunk = os.read(self.read, 65536)
                if not chunk:
                    break
                if self.mode == "hold":
                    self.held += chunk
                elif self.mode == "pass":
                    self._write(chunk)
                elif self.mode == "delay":
                    self.delayed.append((time.monotonic(), chunk))
                    self.delayed_bytes += len(chunk)
                    self._pass_delayed()
        with self.lock:  # its number may be reused at once: _unread must not ask that file
            self._pass_delayed(everything=True)  # the JVM has exited: nothing more to wait for
            os.close(self.read)
            self.read = -1
            self._close_if_done()

    def _write(self, data: bytes) -> None:
        try:
            while data and self.out >= 0:
                data = data[os.write(self.out, data):]
        except OSError:  # stderr closed: the lines have nowhere to go, the JVM goes on
            self.mode = "drop"


_running: JvmStderr | None = None  # the one the JVM of PySpark's gateway writes to


def running_jvm_stderr() -> JvmStderr | None:
    """The pipe the running JVM of PySpark's gateway writes to, where this process started it
    (not under spark-submit, nor where a session was started without hvd_ctsm)."""
    from pyspark import SparkContext

    if SparkContext._gateway is not None and _running is not None and _running.alive():
        return _running
    return None


def hold_jvm_stderr() -> JvmStderr | None:
    """What Spark's JVM prints from now on, held: a new pipe for the JVM about to start or,
    where PySpark reuses its running gateway JVM (a session stopped and started again in one
    process, as in a notebook), the pipe that JVM already writes to. None where stderr cannot
    be redirected (closed): Spark then starts as it always did."""
    global _running
    running = running_jvm_stderr()
    if running is not None:
        running.hold()
        return running
    try:
        _running = JvmStderr()
    except OSError:
        _running = None
    return _running


def failure(exc: BaseException, output: str, asked: dict,
            master: str | None) -> Exception | None:
    """What to raise for a session that did not start with `exc`, its JVM having printed
    `output`: SparkSettingError where Spark's error names the master or one of the settings
    `asked` ({name: value}), or is spark-submit's or Java's refusal of its arguments; else
    SparkStartError with Spark's one-line reason. None where the error is not Spark's (ours,
    or a JVM that exited saying nothing read here): it is raised as it is."""
    if any(mark in str(exc) for mark in GATEWAY_EXITED):
        found = launch_refusal(output)
    else:
        found = java_error(exc)
    if found is None:
        return None
    reason, refused = found
    named = named_setting(reason, f"{exc}\n{output}", asked, master)
    if named:
        error: Exception = SparkSettingError(f"Spark did not start: {named}")
    else:
        kind = SparkSettingError if refused else SparkStartError
        error = kind(f"Spark did not start: {reason.rstrip('.')}; check --master and --conf")
    error.__cause__ = JavaOutput(output.strip() or "(nothing)")
    error.__cause__.__cause__ = exc
    return error


def launch_refusal(output: str) -> tuple[str, bool] | None:
    """(Spark's reason, whether it refuses its arguments) for a JVM that exited before PySpark's
    gateway started, from what it printed; None where it printed neither an exception nor
    Java's refusal of its options."""
    thrown = re.search(r'Exception in thread "main" (.+)', output)
    if thrown:  # spark-submit's checks of its arguments throw from SparkSubmit(Arguments).error
        refused = re.search(r"at org\.apache\.spark\.deploy\.SparkSubmit(Arguments)?\.error\(",
                            output)
        return plain(thrown.group(1)), refused is not None
    if ("Could not create the Java Virtual Machine" in output
            or "Error occurred during initialization of VM" in output):
        said = [line.strip() for line in output.splitlines() if line.strip()
                and not line.startswith(JAVA_PREAMBLE)]
        return f"its JVM did not start: {said[0] if said else 'Java refused its options'}", True
    return None


def java_error(exc: BaseException) -> tuple[str, bool] | None:
    """(the Java exception's one line, False) for an error the JVM raised through Py4J: its
    deepest cause, else the one thrown; None for any other error."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if not names & {"Py4JJavaError", "CapturedException"}:
        return None
    thrown = java_exceptions(str(exc))
    reason = thrown[-1] if thrown else str(exc).strip().split("\n")[0] or type(exc).__name__
    return plain(reason), False


def plain(thrown: str) -> str:
    """A Java exception's line without the class name where it is only Spark's own exception
    class (Java's, as ClassNotFoundException, say what went wrong); at most 300 characters."""
    return re.sub(r"^org\.apache\.spark\.[\w.]*Exception: ", "", thrown.strip())[:300]


def java_exceptions(text: str) -> list[str]:
    """The Java exceptions in a Py4J error's text, each in one line (a message can have more):
    the one thrown (Py4J's ": ..." line), then its causes."""
    found: list[list[str]] = []
    current = None
    for line in text.splitlines():
        if line.startswith((": ", "Caused by:")):
            current = [line.removeprefix(": ").removeprefix("Caused by:").strip()]
            found.append(current)
        elif line.startswith(("\tat ", "\t...")) or not line.strip():
            current = None
        elif current is not None:
            current.append(line.strip())
    return [" ".join(lines) for lines in found]


def named_setting(reason: str, text: str, asked: dict, master: str | None) -> str | None:
    """What Spark refused and the fix, where its error says which: the master, a setting by its
    name, the driver's memory by Java's option for it, or a value only one setting has."""
    if "Master must either be" in reason or "Could not parse Master URL" in reason:
        quoted = re.search(r"Master URL: '(.*)'", reason)
        name = master or (quoted.group(1) if quoted else "")
        return f"it refused the master {name!r} ({reason}); give --master {MASTERS}"
    by_name = (re.search(r"(?P<key>spark\.[\w.\-]+) should be \w+, but was (?P<value>.*)", text)
               or re.search(r"The value '(?P<value>.*?)' in the config \"(?P<key>spark\.[\w.\-]+)"
                            r"\" is invalid\.(?: It should be .*? value\.)?", text))
    if by_name:
        return refused(by_name.group("key"), by_name.group("value").strip(), by_name.group(0))
    heap = re.search(r"Invalid maximum heap size: -Xmx(\S+)", text)
    if heap and asked.get("spark.driver.memory") == heap.group(1):
        return (f"spark.driver.memory={heap.group(1)} is not a size Java takes "
                f"({heap.group(0)}); give a size such as 4g or 512m")
    holders = [key for key, value in asked.items()  # not a word any error may hold
               if not value.isdigit() and len(value) > 1 and value.lower() not in ("true", "false")
               and re.search(rf"(?<![\w.\-/]){re.escape(value)}(?![\w.\-/])", reason)]
    return refused(holders[0], asked[holders[0]], reason) if len(holders) == 1 else None


def refused(key: str, value: str, said: str) -> str:
    return (f"it refused {key}={value} ({said.rstrip('.')}); give {key} a value it takes, or "
            "leave it out")
