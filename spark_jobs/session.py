"""The feature job's SparkSession: hvd_ctsm.spark_session, where the package's lower layers can
reach it without importing spark_jobs (spark_jobs builds on hvd_ctsm, never the other way); plus
what the jobs need from any session they are given (job_settings, check_executors)."""

from __future__ import annotations

import os
from contextlib import contextmanager

from hvd_ctsm.errors import disk_full
from hvd_ctsm.spark_session import (DEFAULT_CONF, REQUIRED_CONF, RUNTIME_CONF, get_spark,
                                    resolve_master, under_spark_submit)

__all__ = ["DEFAULT_CONF", "get_spark", "resolve_master", "under_spark_submit", "job_settings",
           "check_executors", "ExecutorPythonError"]


@contextmanager
def job_settings(spark, conf: dict | None = None):
    """Apply REQUIRED_CONF, RUNTIME_CONF where the application did not set them, and `conf` to
    `spark` for a block, then restore the session's own values: ISO timestamps are parsed as UTC
    whatever session (notebook, cluster) runs the job."""
    chosen = spark.sparkContext.getConf()
    wanted = {k: v for k, v in RUNTIME_CONF.items() if not chosen.contains(k)}
    previous = {}
    for key, value in {**wanted, **REQUIRED_CONF, **(conf or {})}.items():
        previous[key] = spark.conf.get(key, None)
        spark.conf.set(key, value)
    try:
        yield spark
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


class ExecutorPythonError(RuntimeError):
    """The executors' Python cannot import what the jobs run there; the message says the fix."""


_CHECKED: set[str] = set()  # applicationIds whose executors passed check_executors


def _probe(_):
    import importlib
    import sys as executor_sys

    missing = []
    for name in ("pandas", "pyarrow", "hvd_ctsm", "spark_jobs"):  # Petastorm is optional
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing.append(f"{name} ({exc})")
    yield executor_sys.executable, missing


def check_executors(spark) -> None:
    """Stop with the fix when executors cannot import pandas or this package (once per app).

    PYSPARK_PYTHON decides the executors' interpreter and is read when the session starts;
    `spark.pyspark.python` set on a builder has no effect in PySpark 3.5."""
    app = spark.sparkContext.applicationId
    if app in _CHECKED:
        return
    try:
        python, missing = spark.sparkContext.parallelize([0], 1).mapPartitions(_probe).first()
    except Exception as exc:  # the worker itself failed to start (e.g. no such interpreter)
        if disk_full(exc):  # Spark's local dir (TMPDIR's disk) is full: no import is missing
            raise
        python, missing = os.environ.get("PYSPARK_PYTHON", "python3"), [str(exc).splitlines()[0]]
    if missing:
        raise ExecutorPythonError(
            f"Spark executors run {python}, which cannot import {', '.join(missing)}: install "
            "hvd_ctsm and its requirements on every node, and export PYSPARK_PYTHON=<that "
            "environment's python> before the SparkSession starts (restart the notebook's "
            "session; spark.pyspark.python on the builder has no effect)")
    _CHECKED.add(app)
