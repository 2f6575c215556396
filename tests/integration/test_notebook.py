"""The notebook example runs, on the test session's SparkSession (as a notebook's `spark`):
training under horovod.spark where Horovod is installed (the classic stack), else
TorchDistributor (dist.backend=auto), as in a user's notebook."""

import runpy

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.e2e, pytest.mark.both_stacks]


def test_notebook_example_runs_every_step(spark, tmp_path):
    result = runpy.run_path(str(REPO / "docs" / "notebook_example.py"),
                            init_globals={"spark": spark, "WORK": str(tmp_path), "NUM_PROC": 2})
    assert result["spark"] is spark  # the notebook's own session was used, not a new one
    assert result["summary"]["ranks"] == 2 and result["summary"]["steps"] > 0
    assert (tmp_path / "run" / "model.pt").exists()
    assert result["report"]["gate"]["passed"] in (True, False)
    assert (tmp_path / "backtest.json").exists()
    clients = result["meta"]["splits"]["serving"]["rows"]  # one per client
    assert result["scored"]["scored_clients"] == result["scored"]["clients"] == clients
    table = pq.read_table(tmp_path / "scores")
    assert table.num_rows == result["scored"]["rows"] > 0
