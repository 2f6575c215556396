"""horovod.spark.torch.TorchEstimator with a LocalStore: fit on sequences, transform scores rows.

Runs in the test process with the session's SparkSession: pytest's main module is guarded by
`if __name__ == "__main__":`, which the estimator's spawned helpers need.
"""

import pandas as pd
import pytest

from hvd_ctsm.errors import EXIT_BAD_INPUT
from hvd_ctsm.files import outputs
from hvd_ctsm.train.estimator import main, sequence_frame

pytestmark = [pytest.mark.spark, pytest.mark.horovod, pytest.mark.slow]


def _row():
    """One row of the estimator's model inputs: two past events, two padded places."""
    import torch

    return (torch.tensor([[1, 2, 0, 0]]), torch.tensor([[1, 2, 0, 0]]),
            torch.tensor([[4.0, 3.0, 0.0, 0.0]]), torch.tensor([[0.0, 1.5, 0.0, 0.0]]),
            torch.tensor([[1, 2, 1, 3, 0, 0, 0, 0]]), torch.tensor([3]))  # 2 attributes


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
    for out, extra, says in ((theirs, [], "not written by hvd_ctsm"),
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

    from hvd_ctsm.train.estimator import SequenceSaleModel

    tags = [[]] + [[1 + i % 2] for i in range(9)]  # items 1..9, two tags
    torch.manual_seed(0)
    tagged = SequenceSaleModel(10, 4, item_tags=tags).eval()
    assert tagged.ctsm.encoder.tags is not None
    before = tagged(*_row())
    with torch.no_grad():
        tagged.ctsm.encoder.tags.weight[1:] += 1.0  # the tags' vectors change what it predicts
    assert not torch.allclose(before, tagged(*_row()))
    assert SequenceSaleModel(10, 4).ctsm.encoder.tags is None  # no tags: items alone


def test_each_rows_history_ends_at_its_targets_position():
    """No later event reaches a row: every history column stops at the target's position."""
    from types import SimpleNamespace

    from hvd_ctsm.train.estimator import frame_rows

    example = SimpleNamespace(client_id="c", item=[5, 6, 7, 8], event_type=[1, 2, 1, 2],
                              value=[1.0, 2.0, 3.0, 4.0], log_gap=[0.0, 0.5, 1.5, 2.5],
                              client_attrs=[[1, 1], [1, 2], [2, 2], [3, 3]],  # as of each event
                              target_pos=[0, 2], target_item=[6, 8], target_label=[1.0, 0.0])
    first, second = frame_rows(example, max_len=2)
    assert first == ("c", [5, 0], [1, 0], [1.0, 0.0], [0.0, 0.0], [1, 1, 0, 0], 6, 1.0)
    # the last 2 of events 0..2; the attributes as of events 1 and 2, not the later update
    assert second == ("c", [6, 7], [2, 1], [2.0, 3.0], [0.5, 1.5], [1, 2, 2, 2], 8, 0.0)
    no_attrs = SimpleNamespace(**vars(example) | {"client_attrs": [[] for _ in range(4)]})
    assert next(frame_rows(no_attrs, max_len=2))[5] == [0, 0]  # one zero column


def test_the_estimators_model_reads_the_events_types_values_and_gaps():
    """The p(sale) head reads what the trainer's model reads of each past event and of the client
    (on ML-100K the past ratings are most of what it knows); padded places stay out."""
    import torch

    from hvd_ctsm.train.estimator import SequenceSaleModel

    torch.manual_seed(0)
    model = SequenceSaleModel(10, 4, attr_sizes=[4, 5]).eval()
    history, types, values, gaps, attrs, item = _row()
    before = model(history, types, values, gaps, attrs, item)
    for changed in ([history, types + (types > 0), values, gaps, attrs, item],
                    [history, types, values + 2.0 * (values > 0), gaps, attrs, item],
                    [history, types, values, gaps + 1.0 * (history > 0), attrs, item],
                    [history, types, values, gaps, attrs + (attrs > 0), item]):
        assert not torch.allclose(before, model(*changed))
    padded_changed = [history, types, values + 3.0 * (history == 0), gaps,
                      attrs + torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]]), item]
    assert torch.allclose(before, model(*padded_changed))
    plain = SequenceSaleModel(10, 4).eval()  # a dataset naming no attributes: one zero column
    assert plain(history, types, values, gaps, torch.zeros(1, 4), item).shape == (1,)
