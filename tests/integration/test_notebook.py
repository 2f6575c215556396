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


def test_a_notebook_run_is_refused_on_the_driver_and_resumes_with_its_own_settings(spark,
                                                                                    tmp_path):
    """Re-running the training cell replaced the run (overwrite was the default); a refused run
    folder was a failed rank inside a Spark trace; and the API could not resume."""
    from hvd_ctsm.api import make_features, train_model
    from hvd_ctsm.train.spark_train import SparkTrainingError

    data, run = tmp_path / "features", tmp_path / "run"
    make_features(spark, "synthetic:clients=120,items=40,events=3000,seed=5", data, max_len=30,
                  row_groups=4)
    small = ["data.batch_size=16", "model.dim=16", "model.layers=1", "progress=false",
             "dist.threads_per_rank=1", "tracking.enabled=false"]
    first = train_model(spark, data, run, epochs=1, overrides=small)
    for out in (run, data, data / "run"):  # a run; the dataset; a folder inside it
        with pytest.raises(SparkTrainingError) as err:
            train_model(spark, data, out, epochs=1, overrides=small)
        assert "\n" not in str(err.value) and ("already holds a run" in str(err.value)
                                               or "lies inside the input" in str(err.value))
        assert "--" not in str(err.value)  # a notebook's keywords, not the command line's
    assert not (data / "run").exists()
    with pytest.raises(SparkTrainingError, match="pass resume=True to continue it or "
                                                  "overwrite=True to start afresh"):
        train_model(spark, data, run, epochs=1, overrides=small)
    with pytest.raises(FileExistsError, match="pass overwrite=True to replace it"):
        make_features(spark, "synthetic:clients=120,items=40,events=3000,seed=5", data)
    with pytest.raises(ValueError, match=r"^init_from takes a local path .* not the URL "
                                         r"s3://b/run"):  # it said "no model at s3://b/run"
        train_model(spark, data, tmp_path / "warm", init_from="s3://b/run")
    # The run's own config.yaml (model.dim=16): the defaults' model would be refused as another
    resumed = train_model(spark, data, run, epochs=2, resume=True)
    assert resumed["steps"] == 2 * first["steps_per_epoch"]
