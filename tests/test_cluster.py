"""A real Spark standalone cluster on 127.0.0.1: a master and one worker started with the installed
PySpark's `spark-class`, the feature job submitted with `spark-submit --master spark://...` as the
README says, and the master's own status asked whether the application ran there."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_env(tmp: Path) -> dict:
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(tmp),
            "SPARK_WORKER_DIR": str(tmp / "work"), "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def master_status(ui_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as reply:
        return json.load(reply)


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
    """(master URL, master UI port): a master and a 1-core worker, stopped afterwards."""
    tmp = tmp_path_factory.mktemp("cluster")
    port, ui, worker_ui = free_port(), free_port(), free_port()
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
                                       "--host", "127.0.0.1", "--cores", "1", "--memory", "2g",
                                       "--webui-port", str(worker_ui), url], env=env,
                                      stdout=(tmp / "worker.log").open("w"),
                                      stderr=subprocess.STDOUT))
        wait_for(lambda: master_status(ui)["aliveworkers"] >= 1, 90, "the worker")
        yield url, ui, tmp
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_spark_submit_runs_the_feature_job_on_the_cluster(cluster, tmp_path):
    url, ui, tmp = cluster
    out = tmp_path / "features"
    cmd = [str(BIN / "spark-submit"), "--master", url, "--name", "ctsm-cluster-features",
           "--conf", "spark.ui.enabled=false", "--executor-memory", "1g",
           str(REPO / "spark_jobs" / "build_features.py"),
           "--source", "synthetic:clients=60,items=30,events=1500,seed=3", "--out", str(out),
           "--row-groups", "2", "--max-len", "10"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=540, cwd=REPO,
                          env=spark_env(tmp))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "metadata.json").exists()
    status = master_status(ui)
    apps = status.get("completedapps", []) + status.get("activeapps", [])
    names = [app["name"] for app in apps]  # the job's own builder may rename the application
    assert len(apps) == 1 and names[0] in ("ctsm-cluster-features", "hvd_ctsm-features"), names
