"""A worker for the Spark Ctrl-C test: a session started as the feature job starts one, then a
Spark job of about 40 s (one task at a time, each sleeping), through errors.run_cli as every
command runs. It prints "job started" just before the job, "job running" once its first task
is done."""

import sys
import threading
import time

from hvd_ctsm.errors import run_cli
from hvd_ctsm.spark_session import get_spark


def say_when_running(sc) -> None:
    """Prints "job running" once the job's first task is done (the test's Ctrl-C must find it
    running). Not as soon as the job is active: a SIGTERM to the group while pyspark.daemon
    starts, slow on a busy machine, ends the daemon before it tells the executor its port, and
    the executor logs that (seen once on Python 3.13 in a full test run): a start's race, not
    the stop of a running job this test is about."""
    tracker = sc.statusTracker()
    while not any(stage and stage.numCompletedTasks
                  for stage in map(tracker.getStageInfo, tracker.getActiveStageIds())):
        time.sleep(0.1)
    print("job running", flush=True)


def main(argv) -> int:
    spark = get_spark("local[1]", "ctrl-c-test")
    print("job started", flush=True)
    threading.Thread(target=say_when_running, args=(spark.sparkContext,), daemon=True).start()
    slow = spark.sparkContext.parallelize(range(400), 400).map(lambda x: time.sleep(0.1) or x)
    slow.count()
    print("job finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, "ctrl-c-test"))
