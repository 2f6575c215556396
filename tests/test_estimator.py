"""horovod.spark.torch.TorchEstimator with a LocalStore: fit on sequences, transform scores rows.

Runs in the test process with the session's SparkSession: pytest's main module is guarded by
`if __name__ == "__main__":`, which the estimator's spawned helpers need.
"""

import pytest

from hvd_ctsm.estimator import fit_and_predict, sequence_frame

pytestmark = [pytest.mark.spark, pytest.mark.horovod, pytest.mark.slow]


def test_fit_then_transform_predicts_every_row(spark, tiny_features, tmp_path):
    from pyspark.ml import Transformer

    test_rows = sequence_frame(spark, str(tiny_features), "test", 20).toPandas()
    assert all(len(h) == 20 for h in test_rows["history"])
    model, predictions = fit_and_predict(spark, str(tiny_features), str(tmp_path / "store"),
                                         num_proc=2, epochs=1, max_len=20)
    assert isinstance(model, Transformer)
    got = predictions.toPandas()
    assert len(got) == len(test_rows) > 0  # a prediction for every (client, item) row
    assert sorted(zip(got["client_id"], got["item"], strict=True)) == \
        sorted(zip(test_rows["client_id"], test_rows["item"], strict=True))
    assert got["label__output"].between(0.0, 1.0).all()
    assert got["label__output"].nunique() > 1  # depends on the row, not a constant
    assert list((tmp_path / "store" / "runs").iterdir())  # the run went through the Store
