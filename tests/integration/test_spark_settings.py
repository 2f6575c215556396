"""A master or a setting that Spark refuses, given to a program that starts Spark: one line naming
it and the fix, exit 2, no Java stack trace. Each test starts (or fails to start) one real
Spark."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.spark, pytest.mark.both_stacks]
SOURCE = "synthetic:clients=50,items=20,events=500,seed=1"
FEATURES = ["spark_jobs.build_features", "--source", SOURCE, "--out", "{tmp}/out"]
SPARK_REFUSED = [  # what bad-input sweeps gave: each ended "crashed", most with Java's trace
    # spark-submit's own check of the master, before the JVM opens its gateway
    ([*FEATURES, "--master", "bogus"], "hvd-ctsm features",
     "it refused the master 'bogus' (Master must either be yarn or start with"),
    # Java's check of its options: "Invalid maximum heap size: -Xmxabc"
    ([*FEATURES, "--conf", "spark.driver.memory=abc"], "hvd-ctsm features",
     "spark.driver.memory=abc is not a size Java takes"),
    # the SQL session's, at its first use (it was the job's first step)
    ([*FEATURES, "--conf", "spark.sql.shuffle.partitions=abc"], "hvd-ctsm features",
     "it refused spark.sql.shuffle.partitions=abc ("),
    # the SparkContext's, inside the running JVM: a Py4J error, and a trace Spark logs
    (["spark_jobs.pipeline", "--source", SOURCE, "--work", "{tmp}/work", "--registry",
      "{tmp}/registry", "--master", "local[abc]"], "hvd-ctsm pipeline",
     "it refused the master 'local[abc]' (Could not parse Master URL: 'local[abc]')"),
    (["spark_jobs.score_topk", "--data", "{tmp}/features", "--model", "{tmp}/registry", "--out",
      "{tmp}/scores", "--master", "bogus"], "score_topk", "it refused the master 'bogus' ("),
]


@pytest.mark.parametrize("args, prog, refused", SPARK_REFUSED,
                         ids=["master", "driver-memory", "sql-setting", "pipeline-master-url",
                              "score-master"])
def test_a_master_or_setting_spark_refuses_is_one_line_and_exit_2(tmp_path, args, prog, refused):
    done = subprocess.run([sys.executable, "-m", *(a.format(tmp=tmp_path) for a in args)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    line = f"{prog}: error: Spark did not start: {refused}"
    assert done.stderr.startswith(line), done.stderr[-3000:]
    assert len(done.stderr.splitlines()) == 1, done.stderr[-3000:]  # no trace, no JVM lines
    assert sorted(p.name for p in tmp_path.iterdir()) == []



NOTEBOOK = """
import sys
from pyspark.sql import SparkSession
from hvd_ctsm.spark_session import get_spark
from hvd_ctsm.spark_start import SparkSettingError

for bad in ({"spark.sql.shuffle.partitions": "abc"}, {"master": "local[abc]"}):
    try:
        get_spark(**bad)
    except SparkSettingError as refused:
        print("refused:", refused)
assert SparkSession.getActiveSession() is None
spark = get_spark("local[1]")
assert spark.conf.get("spark.sql.shuffle.partitions") == "8"
print("rows:", spark.range(5).count())
spark.sparkContext._jvm.java.lang.System.err.println("the JVM after the start")
spark.sparkContext._jvm.java.lang.System.err.flush()
"""


def test_a_notebook_starts_a_session_after_refused_ones_and_hears_its_jvm():
    """In one process, as in a notebook: a refused SQL setting left its half-made session
    active, and the next get_spark took it; after a refused start, all the JVM printed later
    was dropped (PySpark keeps its JVM for the next session)."""
    done = subprocess.run([sys.executable, "-c", NOTEBOOK], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout.splitlines()
    assert len(said) == 3 and said[2] == "rows: 5", done.stdout
    assert "spark.sql.shuffle.partitions=abc" in said[0] and "'local[abc]'" in said[1], said
    assert "the JVM after the start" in done.stderr, done.stderr[-3000:]
