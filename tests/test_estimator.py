"""horovod.spark.torch.TorchEstimator with a LocalStore: fit on sequences, transform scores rows.

Runs in the test process with the session's SparkSession: pytest's main module is guarded by
`if __name__ == "__main__":`, which the estimator's spawned helpers need.
"""

import pandas as pd
import pytest

from hvd_ctsm import outputs
from hvd_ctsm.errors import EXIT_BAD_INPUT
from hvd_ctsm.estimator import main, sequence_frame

pytestmark = [pytest.mark.spark, pytest.mark.horovod, pytest.mark.slow]


def test_fit_then_transform_predicts_every_row(spark, tiny_features, tmp_path):
    test_rows = sequence_frame(spark, str(tiny_features), "test", 20).toPandas()
    assert all(len(h) == 20 for h in test_rows["history"])
    out = tmp_path / "predictions"
    assert main(["--data", str(tiny_features), "--store", str(tmp_path / "store"),
                 "--out", str(out), "--epochs", "1", "--max-len", "20"]) == 0
    got = pd.read_parquet(out)
    assert len(got) == len(test_rows) > 0  # a prediction for every (client, item) row
    assert sorted(zip(got["client_id"], got["item"], strict=True)) == \
        sorted(zip(test_rows["client_id"], test_rows["item"], strict=True))
    assert got["label__output"].between(0.0, 1.0).all()
    assert got["label__output"].nunique() > 1  # depends on the row, not a constant
    assert list((tmp_path / "store" / "runs").iterdir())  # the run went through the Store
    assert outputs.marker(out)["kind"] == "predictions"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".predictions.")]  # no stage


def test_an_out_it_may_not_replace_is_refused_before_any_work(spark, tiny_features, tmp_path,
                                                                capsys):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("not ours")
    store = tmp_path / "store"
    for out, extra, says in ((theirs, [], "exists; pass --overwrite"),
                             (theirs, ["--overwrite"], "not written by hvd_ctsm"),
                             (tiny_features, ["--overwrite"], "lies inside the input"),
                             (store / "preds", [], "lies inside the input")):
        code = main(["--data", str(tiny_features), "--store", str(store), "--out", str(out),
                     *extra])
        assert code == EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1
    assert (theirs / "keep.txt").read_text() == "not ours"
    assert (tiny_features / "metadata.json").exists()
    assert not store.exists()  # refused before the estimator touched its Store


def test_a_missing_dataset_is_one_line(tmp_path, capsys):
    code = main(["--data", str(tmp_path / "nowhere"), "--store", str(tmp_path / "store"),
                 "--out", str(tmp_path / "out")])
    assert code == EXIT_BAD_INPUT
    assert "point --data at a folder" in capsys.readouterr().err


def test_the_estimators_model_reads_item_tags_where_the_dataset_has_them():
    import torch

    from hvd_ctsm.estimator import SequenceSaleModel

    tags = [[]] + [[1 + i % 2] for i in range(9)]  # items 1..9, two tags
    history, item = torch.tensor([[1, 2, 0, 0]]), torch.tensor([3])
    torch.manual_seed(0)
    tagged = SequenceSaleModel(10, 4, item_tags=tags).eval()
    assert tagged.ctsm.encoder.tags is not None
    before = tagged(history, item)
    with torch.no_grad():
        tagged.ctsm.encoder.tags.weight[1:] += 1.0  # the tags' vectors change what it predicts
    assert not torch.allclose(before, tagged(history, item))
    assert SequenceSaleModel(10, 4).ctsm.encoder.tags is None  # no tags: items alone
