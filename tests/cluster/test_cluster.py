"""A real Spark standalone cluster on 127.0.0.1: a master and one 3-core worker started with the
installed PySpark's `spark-class`, and the README's cluster route run against it:
`MASTER=spark://... ./run.sh pipeline-spark` (the whole pipeline by `spark-submit`: the feature
job, 2 training tasks through horovod.spark, or TorchDistributor where Horovod is not installed,
backtest, deploy), then `spark-submit --master spark://... spark_jobs/score_topk.py`. Each test
asks the master's own status (its JSON UI) whether the application ran there, and the worker's
whether its executors did the work. The notebook API is tested on a local session
(tests/integration/test_notebook.py): on the cluster it ran the same train_on_spark the pipeline
runs, and was dropped with the feature job's own spark-submit (the pipeline runs it) to keep CI,
which runs this tier on both stacks, under 30 minutes."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, RUN_SH_ENV

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.slow, pytest.mark.e2e]


BIN = Path(sys.executable).parent


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports: each socket stays bound until all are picked. Picked one at a
    time, the kernel handed out the master's UI port again for the worker's; the worker's UI
    moved to the next port, and the test read the master's status as the worker's."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def spark_env(tmp: Path) -> dict:
    # HVD_CTSM_SPARK_NICS: Horovod's services and Gloo on loopback, where the cluster lives.
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(tmp),
            "SPARK_WORKER_DIR": str(tmp / "work"), "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HVD_CTSM_SPARK_NICS": "lo"}


def master_status(ui_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as reply:
        return json.load(reply)


def app_ids(ui_port: int) -> set[str]:
    status = master_status(ui_port)
    return {app["id"] for app in status.get("completedapps", []) + status.get("activeapps", [])}


def run_on_cluster(cluster, cmd: list[str], timeout: int = 540,
                   env: dict | None = None) -> tuple[dict, str, str]:
    """Run `cmd` (a driver of one application; `env` adds to its environment); return the
    master's record of the one application it registered, checked to have finished there with
    executors of our worker, and the driver's stdout and stderr."""
    url, ui, worker_ui, tmp = cluster
    before = app_ids(ui)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**spark_env(tmp), **(env or {})})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    status = master_status(ui)
    new = [app for app in status["completedapps"] if app["id"] not in before]
    assert len(new) == 1 and not status["activeapps"], (new, status["activeapps"])
    app = new[0]
    assert app["state"] == "FINISHED" and app["cores"] >= 1, app
    worker = master_status(worker_ui)  # the worker's own JSON status
    ran = [e for e in worker["finishedexecutors"] + worker["executors"] if e["appid"] == app["id"]]
    assert ran, f"no executor of {app['id']} on the worker: it ran in the driver alone"
    return app, proc.stdout, proc.stderr


def wait_for(check, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(master URL, master UI port, worker UI port, folder): a master and a 3-core worker
    (2 training ranks, plus one slot more for the slot-wait check), stopped afterwards."""
    tmp = tmp_path_factory.mktemp("cluster")
    port, ui, worker_ui = free_ports(3)
    env = spark_env(tmp)
    spark_class = str(BIN / "spark-class")
    procs = [subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master",
                               "--host", "127.0.0.1", "--port", str(port), "--webui-port",
                               str(ui)], env=env, stdout=(tmp / "master.log").open("w"),
                              stderr=subprocess.STDOUT)]
    url = f"spark://127.0.0.1:{port}"
    try:
        wait_for(lambda: master_status(ui), 90, "the master")
        procs.append(subprocess.Popen([spark_class, "org.apache.spark.deploy.worker.Worker",
                                       "--host", "127.0.0.1", "--cores", "3", "--memory", "3g",
                                       "--webui-port", str(worker_ui), url], env=env,
                                      stdout=(tmp / "worker.log").open("w"),
                                      stderr=subprocess.STDOUT))
        wait_for(lambda: master_status(ui)["aliveworkers"] >= 1, 90, "the worker")
        yield url, ui, worker_ui, tmp
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def spark_submit(url: str, name: str, script: str, *args: str) -> list[str]:
    """The README's form: spark-submit --master spark://HOST:7077 spark_jobs/SCRIPT ARGS."""
    return [str(BIN / "spark-submit"), "--master", url, "--name", name,
            "--conf", "spark.ui.enabled=false", "--executor-memory", "1g",
            str(REPO / "spark_jobs" / script), *args]


TINY_TRAINING = ["data.batch_size=16", "model.dim=16", "model.layers=1", "progress=false",
                 "dist.threads_per_rank=1"]  # with EPOCHS=1


@pytest.mark.both_stacks
def test_run_sh_pipeline_with_two_training_tasks_then_scoring_on_the_cluster(cluster, tmp_path):
    """The README's route: MASTER=spark://... ./run.sh pipeline-spark, its knobs in the
    environment and the pipeline's own options after it."""
    url = cluster[0]
    work, registry, scores = tmp_path / "pipeline", tmp_path / "registry", tmp_path / "scores"
    knobs = {"MASTER": url, "WORK": str(tmp_path), "NP": "2", "EPOCHS": "1",
             "DATA": "synthetic:clients=80,items=60,events=2000,seed=3",
             "GATE": "sampled.hr@10>=0", "CONFIG": "default", **RUN_SH_ENV,
             "SPARK_SUBMIT_ARGS": "--executor-memory 1g --conf spark.ui.enabled=false "
             # conftest's TEST_JVM_OPTIONS, less the collector: run.sh splits this on spaces
             "--conf spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1"}
    app, _, err = run_on_cluster(cluster, [
        "bash", str(REPO / "run.sh"), "pipeline-spark", "--row-groups", "4", "--max-len", "10",
        *TINY_TRAINING], env=knobs)
    assert app["name"] == "hvd_ctsm-pipeline", app["name"]
    assert " INFO SparkContext:" not in err, err[:3000]  # Spark's start: 40 lines of no news
    assert app["cores"] >= 2  # both training ranks had a task slot at once
    record = json.loads((work / "pipeline.json").read_text())
    assert [s["step"] for s in record["steps"]] == ["features", "train", "backtest", "deploy"]
    assert record["result"].startswith("deployed"), record
    summary = json.loads((work / "model" / "train_summary.json").read_text())
    assert summary["ranks"] == 2 and summary["steps"] > 0
    app, out, _ = run_on_cluster(cluster, spark_submit(
        url, "ctsm-cluster-score", "score_topk.py", "--data", str(work / "features"),
        "--model", str(registry), "--out", str(scores), "--k", "5", "--json"))
    assert app["name"] in ("ctsm-cluster-score", "hvd_ctsm-score"), app["name"]
    scored = json.loads(out.strip().splitlines()[-1])
    clients = json.loads((work / "features" / "metadata.json").read_text())["counts"]["clients"]
    assert scored["scored_clients"] == scored["clients"] == clients  # every client scored
    assert scored["short"] == 0 and pq.read_table(scores).num_rows == scored["rows"] == 5 * clients


SLOT_WAIT = """
import json, sys
from hvd_ctsm.spark_session import get_spark
from hvd_ctsm.train.spark_train import task_slots, wait_for_task_slots
spark = get_spark(master=sys.argv[1], app_name="ctsm-cluster-slots")
first = (task_slots(spark), spark.sparkContext.defaultParallelism)  # no executor yet
wait_for_task_slots(spark, 3, 120)
print(json.dumps({"first": first, "after": task_slots(spark)}))
"""


def test_training_waits_for_the_executors_task_slots_to_register(cluster):
    """Before: the slot check read defaultParallelism as the application started, which is 2
    (Spark's floor) before any executor registers, so num_proc=3 was refused on a 3-slot
    cluster (and num_proc=2 passed on a 1-slot one). Classic stack only: under Spark 4.3 the
    worker's executor had registered before the session was returned (first reading 3), so
    there the test could not show the wait."""
    app, out, _ = run_on_cluster(cluster, [sys.executable, "-c", SLOT_WAIT, cluster[0]])
    readings = json.loads(out.strip().splitlines()[-1])
    assert readings["first"][0] < 3 and readings["first"][1] < 3, readings  # none registered
    assert readings["after"] == 3 == app["cores"]
