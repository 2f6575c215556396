"""MLflow tracking, registry and pyfunc flavour on real local MLflow stores (SQLite in tmp_path).

The end-to-end runs (`./run.sh demo`, then MLflow's own client, the pyfunc model scored with
pandas and with Spark) are in tests/integration/test_tracking.py; this file holds the unit tier."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hvd_ctsm.config import load_config
from hvd_ctsm.tracking.link import flat_params, metric_key, read_link
from tests.conftest import REPO
from tests.helpers.small_pyfunc import registered_model


def test_metric_keys_and_params_are_what_mlflow_accepts():
    assert metric_key("val_full/ndcg@10") == "val_full/ndcg_at_10"
    assert metric_key("time_share/allreduce") == "time_share/allreduce"
    assert metric_key("a:b") == "a_b"
    params = flat_params({"optim": {"lr": 0.002}, "model": {"head_weights": {"sale": 0.1}}})
    assert params == {"optim.lr": "0.002", "model.head_weights": '{"sale": 0.1}'}
    # a dict setting's keys become names MLflow accepts (it refused the whole run's params)
    assert flat_params({"debug": {"step_delay_s": {"*": 0.3}}}) == {"debug.step_delay_s._": "0.3"}


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




def test_the_pyfunc_refuses_values_that_are_not_finite():
    """values of [nan, 1.0] or [1.0, inf] gave empty recommendations without a word (the
    scores became NaN, and NaN scores read as 'fewer unseen items than K'); so does a value
    beyond float32's range, which becomes inf on the way in."""
    import pandas as pd

    from hvd_ctsm.tracking.pyfunc_input import HistoryError, history_rows

    vocab, meta = {"items": ["<pad>", "a", "b"], "attrs": {}}, {"attrs": []}
    ok = pd.DataFrame({"client_id": ["c1"], "items": [["a", "b"]], "values": [[1.0, 2.0]]})
    assert history_rows(ok, vocab, meta, max_len=10)[0].history_len == 2
    for bad in ([float("nan"), 1.0], [1.0, 1e39], [1.0, float("inf")]):
        frame = pd.DataFrame({"client_id": ["c1"], "items": [["a", "b"]], "values": [bad]})
        with pytest.raises(HistoryError, match="client c1: `values` must be finite numbers"):
            history_rows(frame, vocab, meta, max_len=10)


@pytest.fixture(scope="module")
def pyfunc_model(tmp_path_factory):
    """A small CTSM registered as deploy registers it, loaded by MLflow (input checks and all)."""
    import mlflow

    return mlflow.pyfunc.load_model(registered_model(tmp_path_factory.mktemp("pyfunc")))


def test_a_history_that_is_null_gets_no_items_and_the_other_rows_are_scored(pyfunc_model):
    """MLflow's signature check refused the whole input for one row's null `items`."""
    import pandas as pd

    frame = pd.DataFrame({"client_id": ["c1", "c2"], "items": [["10", "11"], None]})
    top = pyfunc_model.predict(frame, params={"k": 3})
    assert list(top["client_id"]) == ["c1", "c2"]
    assert [len(items) for items in top["item_ids"]] == [3, 0]
    assert list(top["scores"][1]) == []


def test_integer_item_and_client_ids_are_read_as_their_text(pyfunc_model):
    """MLflow's signature check refused int item lists and int64 client ids ("Can not safely
    convert int64 to <U0"). A Spark int column with a null reaches pandas as floats (NaN for
    the null): whole ones are ids too, and a null id is a missing one."""
    import numpy as np
    import pandas as pd

    from hvd_ctsm.tracking.pyfunc_input import HistoryError

    as_text = pd.DataFrame({"client_id": ["7", "1"], "items": [["10", "11"], ["12"]]})
    expected = pyfunc_model.predict(as_text, params={"k": 3})
    as_ints = pd.DataFrame({"client_id": np.array([7, 1], dtype=np.int64),
                            "items": [[10, 11], np.array([12], dtype=np.int32)]})
    pd.testing.assert_frame_equal(pyfunc_model.predict(as_ints, params={"k": 3}), expected)
    # a null client id is the row's position (1), as an absent client_id column is
    with_nulls = pd.DataFrame({"client_id": [7.0, np.nan],
                               "items": [np.array([10.0, np.nan, 11.0]), [12, None]]})
    pd.testing.assert_frame_equal(pyfunc_model.predict(with_nulls, params={"k": 3}), expected)
    for bad in ([10.5], [True], [["10"]]):
        frame = pd.DataFrame({"client_id": ["c1"], "items": [bad]})
        with pytest.raises(HistoryError, match=r"^client c1: items holds .* cast the column "
                                               r"to strings$"):
            pyfunc_model.predict(frame)


def test_rows_without_a_known_item_are_counted_in_one_warning_per_predict(pyfunc_model, caplog):
    """They get no items (no state to score from), which said nothing; one line per call
    says how many, with up to 3 of their clients."""
    import logging

    import pandas as pd

    frame = pd.DataFrame({"client_id": ["c1", "c2", "c3", "c4", "c5"],
                          "items": [["10"], ["unknown"], [], None, ["x", "y"]]})
    with caplog.at_level(logging.WARNING, logger="hvd_ctsm.tracking"):
        top = pyfunc_model.predict(frame, params={"k": 3})
        pyfunc_model.predict(frame.head(1), params={"k": 3})  # every row known: no line
    assert [len(items) for items in top["item_ids"]] == [3, 0, 0, 0, 0]
    lines = [r for r in caplog.records if r.name == "hvd_ctsm.tracking"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    message = lines[0].getMessage()
    assert "4 of 5 rows got no recommendations" in message
    assert "model's vocabulary" in message and "c2, c3, c4" in message and "c5" not in message


def test_a_value_too_large_for_the_model_is_refused_in_one_line(pyfunc_model):
    """1e30 is finite and inside float32's range, yet the row silently got no items: the
    event's vector (the value through the model's numeric layers) overflowed the float32
    squares of the first layer norm, and the client's state became NaN."""
    import math

    import pandas as pd

    from hvd_ctsm.tracking.pyfunc_input import HistoryError

    def history(value: float) -> pd.DataFrame:
        return pd.DataFrame({"client_id": ["c1"], "items": [["10", "11"]],
                             "values": [[1.0, value]]})

    top = pyfunc_model.predict(history(1e15), params={"k": 3})  # the bound: still scored
    assert len(top["item_ids"][0]) == 3 and all(map(math.isfinite, top["scores"][0]))
    for value in (1e30, -1e16):
        with pytest.raises(HistoryError, match=r"^client c1: `values` must be finite numbers "
                                               r"between -1e\+15 and 1e\+15 .*; got "
                                               r"\[-?1e\+[0-9]+\]$"):
            pyfunc_model.predict(history(value))



def test_a_version_whose_vocab_json_was_edited_is_refused_at_load(tmp_path):
    """The pyfunc named items from vocab.json whatever its bytes: swapped ids were served."""
    from types import SimpleNamespace

    from hvd_ctsm.data.dataset_meta import DatasetError
    from hvd_ctsm.tracking.pyfunc import VERSION_ARTIFACT, CtsmModel
    from tests.helpers.small_pyfunc import version_folder

    version = version_folder(tmp_path / "v0001")
    context = SimpleNamespace(artifacts={VERSION_ARTIFACT: str(version)})
    CtsmModel().load_context(context)
    vocab = json.loads((version / "vocab.json").read_text())
    vocab["items"][1], vocab["items"][2] = vocab["items"][2], vocab["items"][1]
    (version / "vocab.json").write_text(json.dumps(vocab) + "\n")
    with pytest.raises(DatasetError, match="not the vocabulary this dataset was written with"):
        CtsmModel().load_context(context)
