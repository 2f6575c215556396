"""A SparkSession with settings that suit the feature job, training on Spark and scoring, on one
machine or a cluster."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hvd_ctsm import errors, spark_start

# PySpark 4.3 warns at each pandas conversion that it "does not yet fully support pandas >= 3.0.0".
# The one incompatibility our jobs meet is handled (spark_jobs/pandas_frames.py), and the current
# stack's CI runs them on pandas 3 (docs/SUPPORTED_STACK.md); repeated at every step, the warning
# was most of what the demo printed. Only that message is silenced.
warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas >= 3",
                        category=FutureWarning)

# The one table of Spark settings. The feature job applies REQUIRED_CONF and RUNTIME_CONF to
# any session it is given, a notebook's too (spark_jobs.session.job_settings); a session we
# start gets DEFAULT_CONF, which adds what can only be set before the JVM starts.
REQUIRED_CONF = {
    # ISO cutoffs and timestamps are read as UTC whatever the machine's zone is.
    "spark.sql.session.timeZone": "UTC",
    # Spark 4 (and runtimes built on it) turn ANSI SQL on by default: a malformed value then makes
    # a cast raise and fail the job, where the validator reads the cast's null as a rejected row
    # with its reason. One bad input row must be counted, never fail the job (Spark 3.5: off).
    "spark.sql.ansi.enabled": "false",
}
RUNTIME_CONF = {  # for speed: applied unless the application set them itself
    # The default 200 shuffle partitions are far too many for local runs; AQE coalesces the rest.
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}
STARTUP_CONF = {
    # The UI costs start-up time and a port; nobody looks at it in batch runs or tests.
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "4g",
    # Parquet writes with Hadoop's committer leave no _SUCCESS noise for Petastorm to trip on.
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
}
DEFAULT_CONF = {**STARTUP_CONF, **RUNTIME_CONF, **REQUIRED_CONF}
LOG4J2 = Path(__file__).with_name("spark_log4j2.properties")  # the driver's log settings
JOB_LOG_DELAY_S = 30.0  # how late Spark's log reaches stderr while a job runs (spark_log_kept_back)


def get_spark(master: str | None = None, app_name: str = "hvd_ctsm-features", **conf):
    """Return the active SparkSession, or start one with DEFAULT_CONF plus `conf`.

    The master: `master` when given, else spark-submit's, else local[*] (resolve_master).

    Keys in `conf` may use underscores for dots (spark_sql_shuffle_partitions="4"). An active
    session is reused as is (only runtime settings in `conf` are applied to it), so a notebook's
    session keeps its own master and memory.
    """
    from pyspark.sql import SparkSession

    asked = {setting_name(k): str(v) for k, v in conf.items()}
    settings = {**DEFAULT_CONF, "spark.executorEnv.PYTHONWARNINGS": _worker_warnings(), **asked}
    active = SparkSession.getActiveSession()
    if active is not None:
        for key, value in conf.items():
            try:
                active.conf.set(setting_name(key), str(value))
            except Exception:  # static settings cannot change on a running session
                pass
        return active
    # Python workers must run the interpreter of the driver (the virtual environment).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    master = resolve_master(master)
    quiet_start(settings, master)
    builder = SparkSession.builder.appName(app_name)
    if master:  # None: leave it to spark-submit's --master
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = start(builder, asked, master)
    spark.sparkContext.setLogLevel("ERROR")
    cancel_jobs_on_ctrl_c(spark.sparkContext)
    return spark


def start(builder, asked: dict, master: str | None):
    """builder.getOrCreate(), or one line saying why Spark did not start (spark_start.failure:
    bad input where it names the master or a setting in `asked`) instead of Java's trace. What
    the JVM prints is held while it starts (spark_start.JvmStderr); under spark-submit the JVM
    is spark-submit's, already running."""
    held = None if under_spark_submit() else spark_start.hold_jvm_stderr()
    spark = None
    try:
        spark = builder.getOrCreate()
        # The SQL session reads its settings at its first use: a bad one fails here, not in
        # the job's first step.
        spark.conf.get("spark.sql.session.timeZone")
    except BaseException as exc:  # pyspark's error types differ between 3.5 and 4
        output = held.restore() if held else ""
        error = spark_start.failure(exc, output, asked, master)
        if held and error is not None:
            held.discard()  # what Spark said is in the line, and all of it in --debug's
        elif held:
            held.release()
        if spark is not None:  # else the next get_spark in this process would reuse it
            stop_quietly(spark)
        if error is not None:
            raise error  # noqa: B904  its cause is Spark's error and output
        if any(mark in str(exc) for mark in spark_start.GATEWAY_EXITED):
            raise RuntimeError(no_java_line()) from None
        raise
    if held:
        held.restore()
        held.release()
    return spark


@contextmanager
def spark_log_kept_back() -> Iterator[None]:
    """While inside (a feature job's Spark work), what Spark's JVM logs goes on to stderr
    JOB_LOG_DELAY_S late. A block that ends in a full disk drops what is held then: Spark logged
    each failed task's Java trace (400 lines for a tiny job) above the one line that says what
    to do, and --debug's traceback holds the same trace (--debug keeps the log too). Any other
    failure passes it on at once, before its own line: there it may be the only clue. Nothing
    changes for a JVM this process did not start (spark-submit's, a notebook's own session)."""
    jvm = spark_start.running_jvm_stderr()
    if jvm is None:
        yield
        return
    jvm.delay(JOB_LOG_DELAY_S)
    try:
        yield
    except BaseException as exc:
        jvm.settle(drop=errors.disk_full(exc) is not None and not errors.DEBUG.is_set())
        raise
    jvm.settle(drop=False)


def stop_quietly(spark) -> None:
    try:
        spark.stop()
    except Exception:  # noqa: BLE001  the start's own error is the one to report
        pass


def java_problem() -> tuple[str, str] | None:
    """(what is wrong, the fix) when Spark cannot start a JVM here, or None: Spark starts
    $JAVA_HOME/bin/java when JAVA_HOME is set, else the java on PATH."""
    import shutil

    home = os.environ.get("JAVA_HOME")
    if home and not os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return (f"JAVA_HOME={home} has no bin/java",
                "point JAVA_HOME at a Java 17 installation, or unset it to use the java on PATH")
    if not home and shutil.which("java") is None:
        return ("java not found", "apt-get install openjdk-17-jre-headless (./run.sh setup does)")
    return None


def no_java_line() -> str:
    """Why Spark's JVM did not start, as far as this process can tell, and the fix."""
    problem = java_problem()
    if problem:
        return f"Spark's JVM did not start: {problem[0]}; {problem[1]}"
    return ("Spark's JVM did not start (its own error is above); hvd-ctsm doctor checks Java "
            "and Spark")


def cancel_jobs_on_ctrl_c(sc) -> None:
    """Ctrl-C while the driver waits on Spark cancels Spark's jobs, and the call that waited
    returns their error (errors.run_cli: "interrupted", exit 130). PySpark's own handler raised
    KeyboardInterrupt inside that Py4J call: the driver's connection to the JVM broke, and the
    command ended in pages of Py4J tracebacks and "crashed". Ctrl-C in Python code stops it at
    once, as usual, and a third Ctrl-C wherever it is. Only a session this process starts,
    from its main thread: a notebook's handler is its own.

    A SIGTERM (a scheduler's stop, a cluster manager's) is taken alike where it had no handler
    (or this one): the command ended where it was with pipeline.json saying "running" and its
    stage left behind. It says "stopped by SIGTERM" and exits 143 (errors.Terminated)."""
    if threading.current_thread() is threading.main_thread():
        handler = _CtrlC(sc)
        signal.signal(signal.SIGINT, handler)
        term = signal.getsignal(signal.SIGTERM)
        if term is signal.SIG_DFL or isinstance(term, _CtrlC):  # a launcher's stays its own
            signal.signal(signal.SIGTERM, handler)


class _CtrlC:
    def __init__(self, sc):
        self.sc, self.presses = sc, 0

    def __call__(self, signum, frame):
        self.presses += 1
        sigterm = signum == signal.SIGTERM
        if sigterm:
            self._jvm_end_unsaid()
        if self.presses > 2 or not waiting_on_the_jvm(frame):
            raise errors.Terminated("stopped by SIGTERM") if sigterm else KeyboardInterrupt
        if sigterm:
            errors.TERMINATED.set()
        errors.CTRL_C.set()
        if self.presses == 1:
            threading.Thread(target=self._cancel_jobs, name="ctrl-c", daemon=True).start()

    def _jvm_end_unsaid(self) -> None:
        """A SIGTERM to the process group (a scheduler's stop of a job: YARN's, Airflow's) stops
        Spark's JVM as well; pyspark starts it ignoring SIGINT, not SIGTERM. The calls waiting on
        it then fail: Py4J logged each failure's traceback ("Exception while sending command"),
        and PySpark's accumulator server printed its lost connection's (EOFError), around the
        one line. This process is ending: the stop's line is the news."""
        logging.getLogger().addFilter(
            lambda record: "Exception while sending command" not in record.getMessage())
        server = getattr(self.sc, "_accumulatorServer", None)
        if server is not None:
            server.handle_error = lambda request, client_address: None

    def _cancel_jobs(self):
        """The running jobs, then any job the driver starts on its way out, until it stops."""
        try:
            self.sc.setLogLevel("OFF")  # the cancelled tasks' warnings
            while True:
                self.sc.cancelAllJobs()
                time.sleep(0.2)
        except Exception:  # noqa: BLE001 - the session stopped: nothing left to cancel
            return


def waiting_on_the_jvm(frame) -> bool:
    """Whether the main thread, at `frame`, is inside a Py4J call (a Spark action's wait)."""
    while frame is not None:
        if f"{os.sep}py4j{os.sep}" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def quiet_start(settings: dict, master: str | None) -> None:
    """Spark's start without its five lines of no news: our log4j2 file for the driver JVM
    (unless the settings name Java options of their own), and in local mode the loopback
    address to bind to (Spark's hostname check warned where the host's name resolves to it)."""
    if LOG4J2.exists():
        settings.setdefault("spark.driver.extraJavaOptions",
                            f"-Dlog4j2.configurationFile={LOG4J2.as_uri()}")
    if master and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def _worker_warnings() -> str:
    """PYTHONWARNINGS for Spark's Python workers: this process's own, plus silence for Petastorm's
    deprecation warnings (hvd_ctsm.data.schema)."""
    from hvd_ctsm.data.schema import PETASTORM_WORKER_WARNINGS

    own = os.environ.get("PYTHONWARNINGS", "")
    return ",".join(filter(None, [PETASTORM_WORKER_WARNINGS, own]))


def under_spark_submit() -> bool:
    """True inside a driver started by spark-submit (its JVM already holds the master)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def resolve_master(requested: str | None, local_default: str = "local[*]") -> str | None:
    """The master to set on the builder: the one asked for; none under spark-submit (its
    --master, or spark.master from spark-defaults.conf, wins); else `local_default`."""
    if requested:
        return requested
    return None if under_spark_submit() else local_default



def setting_name(name: str) -> str:
    """A Spark setting's name from a keyword argument's (spark_sql_shuffle_partitions)."""
    return name.replace("_", ".") if "." not in name else name
