"""MLflow tracking, registry and pyfunc flavour on real local MLflow stores (SQLite in tmp_path).

The end-to-end test runs `./run.sh demo` itself (features, 2 ranks under torchrun, backtest, gate,
deploy, score) into tmp_path and reads what it left through MLflow's own client; the pyfunc
model is then loaded from the registry and scored with pandas and with Spark.
This file holds the unit-tier part; the rest is in tests/integration/test_tracking.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_ctsm.config import load_config
from hvd_ctsm.tracking.link import flat_params, metric_key, read_link
from tests.conftest import REPO

DEMO_DATA = "synthetic:clients=160,items=60,events=6000,seed=11"
DEMO_TRAIN = ["data.batch_size=16", "model.dim=32", "model.layers=1", "progress=false"]


def test_metric_keys_and_params_are_what_mlflow_accepts():
    assert metric_key("val_full/ndcg@10") == "val_full/ndcg_at_10"
    assert metric_key("time_share/allreduce") == "time_share/allreduce"
    assert metric_key("a:b") == "a_b"
    params = flat_params({"optim": {"lr": 0.002}, "model": {"head_weights": {"sale": 0.1}}})
    assert params == {"optim.lr": "0.002", "model.head_weights": '{"sale": 0.1}'}


def test_without_mlflow_tracking_is_off_with_one_log_line(tmp_path):
    """mlflow made unimportable (sys.modules entry None): the writer is TensorBoard's alone,
    one warning says why, and no store is created."""
    code = (
        "import sys, logging; sys.modules['mlflow'] = None\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from hvd_ctsm import tracking\n"
        "from hvd_ctsm.config import load_config\n"
        f"cfg = load_config(None, ['out={tmp_path / 'run'}', 'data.path={tmp_path}'])\n"
        "for _ in range(2):\n"
        "    assert tracking.metrics_writer('TB', cfg, {}, 'horovod', 1, False) == 'TB'\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "MLflow tracking is off" in line]
    assert len(lines) == 1 and "mlflow package cannot be imported" in lines[0]
    assert not (tmp_path / "mlflow").exists()


def test_a_run_in_the_default_local_store(tmp_path, monkeypatch):
    """Params, tags, artifacts and buffered step metrics reach a SQLite store beside the run
    folder; the off switch writes nothing."""
    from mlflow import MlflowClient

    from hvd_ctsm import tracking
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    data = tmp_path / "features"
    data.mkdir()
    (data / "metadata.json").write_text(json.dumps({"source": "synthetic:x", "counts": {}}))
    off = load_config(None, [f"out={tmp_path / 'off' / 'run'}", f"data.path={data}",
                             "tracking.enabled=false"])
    assert tracking.metrics_writer("TB", off, {}, "horovod", 1, False) == "TB"
    assert not (tmp_path / "off").exists()

    cfg = load_config(None, [f"out={tmp_path / 'run'}", f"data.path={data}", "optim.lr=0.01"])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("epochs: 1\n")

    class Board:
        closed = False

        def add_scalar(self, *args):
            pass

        def close(self):
            Board.closed = True

    writer = tracking.metrics_writer(Board(), cfg, {"source": "synthetic:x"}, "torch", 2, False)
    for step in (10, 20):
        writer.add_scalar("loss/next_item", 1.0 / step, step)
        writer.add_scalar("val_full/ndcg@10", step / 100, step)
    writer.close()
    assert Board.closed
    link = read_link(tmp_path / "run")
    assert link.tracking_uri == f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    client = MlflowClient(link.tracking_uri)
    run = client.get_run(link.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["optim.lr"] == "0.01"
    assert run.data.tags["backend"] == "torch" and run.data.tags["ranks"] == "2"
    assert run.data.tags["dataset.source"] == "synthetic:x"
    history = client.get_metric_history(link.run_id, "val_full/ndcg_at_10")
    assert [(m.step, m.value) for m in history] == [(10, 0.1), (20, 0.2)]
    assert {a.path for a in client.list_artifacts(link.run_id)} == {"config.yaml",
                                                                    "metadata.json"}
    assert (tmp_path / "mlflow" / "artifacts").is_dir()


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """`./run.sh demo` on a small synthetic set, 2 epochs, into a fresh WORK folder. 8 row groups
    per split: the default 64 for 160 clients wrote 256 files of 2-3 rows each, most of the
    fixture's time."""
    work = tmp_path_factory.mktemp("demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env |= {"WORK": str(work), "DATA": DEMO_DATA, "EPOCHS": "2", "NP": "2", "ROW_GROUPS": "8",
            "GATE": "ndcg@10>=0.02", "VENV": sys.prefix, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(REPO / "run.sh"), "demo", *DEMO_TRAIN], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    for warning in ("type hints to the `predict`", "serialized using CloudPickle",
                    "input example was not provided"):  # deploy removed their causes
        assert warning not in proc.stdout + proc.stderr, warning
    # Petastorm's deprecation warnings (in the driver and every Spark Python worker) and
    # torchrun's banner about OMP_NUM_THREADS are silenced: the demo's output is its steps.
    for noise in ("FutureWarning", "Setting OMP_NUM_THREADS"):
        assert noise not in proc.stdout + proc.stderr, noise
    return work
