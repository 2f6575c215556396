"""Spark ML route: horovod.spark.torch.TorchEstimator on a DataFrame of sequences.

    python -m hvd_ctsm.train.estimator --data FEATURES --store DIR --out PREDICTIONS [--num-proc 2]
                                 [--overwrite]

`fit(df)` trains a CTSM's encoder and p(sale) head on (history, item, label) rows (the history's
items, event types, values, time gaps and the client's attributes as of each event:
`sequence_frame`) through a Store, with Horovod on the
Spark executors, and returns a Spark ML Transformer whose `transform` adds `label__output` =
p(sale) to every (client, item) row. The Store holds the intermediate Parquet data and the run's
checkpoints: a local folder here, `hdfs://...` (HDFSStore) on Hadoop,
`/dbfs/...` (DBFSLocalStore) on Databricks; `hvd_ctsm.distributed.spark_store` picks by prefix.

The estimator starts helper processes with `spawn`, which re-imports the driver's main module:
a driver script must keep its work under a `__main__` guard (as this module does).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch
from torch import nn

from hvd_ctsm.config.model_config import ModelConfig
from hvd_ctsm.data.schema import EVENT_TYPES
from hvd_ctsm.errors import EXIT_BAD_INPUT, arg_parser
from hvd_ctsm.files import outputs, storage
from hvd_ctsm.files.storage import StorageError, location
from hvd_ctsm.model.ctsm import CTSM, ModelSizes

# The frame's history columns: (column, the dataset's field, element type).
HISTORY = [("history", "item", int), ("history_type", "event_type", int),
           ("history_value", "value", float), ("history_gap", "log_gap", float)]
# The client's attributes as of each event, [max_len, attributes] flattened row by row (one
# zero column where the dataset names none, so the frame's shape never depends on the data).
ATTRS = "history_attrs"
FEATURES, LABEL = [column for column, _, _ in HISTORY] + [ATTRS, "item"], "label"


def attrs_width(count: int) -> int:
    """The ATTRS column's values per event for a dataset of `count` client attributes."""
    return max(1, count)


class SequenceSaleModel(nn.Module):
    """p(sale) of (a history's item indices, event types, values and log time gaps, each
    right-padded with 0; the client's attribute indices as of each event, flattened; a candidate
    item): a CTSM encoder with its side features (client attributes of `attr_sizes`, the
    dataset's vocabulary sizes, where it names any) and its sale head. With `item_tags` (each
    item's tag indices, vocab.json's), each item's vector adds the mean of its tags' vectors,
    as the trainer's default model (model.item_tags) does."""

    def __init__(self, num_items: int, max_len: int, dim: int = 32, layers: int = 1,
                 heads: int = 2, dropout: float = 0.1, item_tags: list[list[int]] | None = None,
                 attr_sizes: list[int] | None = None):
        super().__init__()
        sizes = ModelSizes(num_items=num_items, num_event_types=len(EVENT_TYPES) + 1,
                           attr_sizes=list(attr_sizes or []), max_len=max_len,
                           item_tags=item_tags or [])
        cfg = ModelConfig(dim=dim, layers=layers, heads=heads, dropout=dropout,
                          item_tags=bool(item_tags))
        self.ctsm = CTSM(sizes, cfg)

    def forward(self, history: torch.Tensor, history_type: torch.Tensor,
                history_value: torch.Tensor, history_gap: torch.Tensor,
                history_attrs: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        rows = item.shape[0]
        history = history.long().reshape(rows, -1)
        batch = {"item": history, "event_type": history_type.long().reshape(rows, -1),
                 "value": history_value.float().reshape(rows, -1),
                 "log_gap": history_gap.float().reshape(rows, -1),
                 "client_attrs": history_attrs.long().reshape(*history.shape, -1)}
        batch["target_row"] = torch.arange(rows)  # each row's state after its last event
        batch["target_pos"] = ((history > 0).sum(dim=1) - 1).clamp(min=0)
        return self.ctsm.p_sale(self.ctsm.states_at(batch), item.long().reshape(-1))


def sequence_frame(spark, data: str, split: str, max_len: int):
    """(client_id, history, history_type, history_value, history_gap, history_attrs, item,
    label) rows, one per target of a feature-job split; the history columns: the events up to
    the target's position (the last max_len; none after it), right-padded with 0 to max_len."""
    from hvd_ctsm.data.arrow_reader import spark_rows
    from hvd_ctsm.data.batches import split_url

    fields = ["client_id", *[field for _, field, _ in HISTORY], "client_attrs", "target_pos",
              "target_item", "target_label"]
    rdd = spark_rows(spark, split_url(data, split), fields)
    columns = ", ".join(f"{column} array<{kind.__name__}>" for column, _, kind in HISTORY)
    return spark.createDataFrame(rdd.flatMap(lambda example: frame_rows(example, max_len)),
                                 f"client_id string, {columns}, {ATTRS} array<int>, item int, "
                                 "label float")


def frame_rows(example, max_len: int):
    """sequence_frame's rows of one dataset example: per target, the HISTORY columns of the
    events up to its position (the state that predicts it; never a later event)."""
    def padded(values, pos: int, kind) -> list:
        kept = [kind(v) for v in values[:pos + 1][-max_len:]]
        return kept + [kind(0)] * (max_len - len(kept))

    attrs = np.asarray(example.client_attrs)
    if attrs.ndim != 2:  # no attributes: an empty column per event
        attrs = np.zeros((len(example.item), 0), np.int64)
    width = attrs_width(attrs.shape[1])
    attrs = np.pad(attrs, ((0, 0), (0, width - attrs.shape[1])))  # [events, width]
    for pos, item, label in zip(example.target_pos, example.target_item, example.target_label,
                                strict=True):
        history = [padded(getattr(example, field), pos, kind) for _, field, kind in HISTORY]
        kept = [int(a) for a in attrs[:pos + 1][-max_len:].reshape(-1)]
        yield (str(example.client_id), *history, kept + [0] * (max_len * width - len(kept)),
               int(item), float(label))


def build_estimator(store_path: str, num_items: int, max_len: int, num_proc: int = 2,
                    epochs: int = 2, batch_size: int = 64, lr: float = 0.005,
                    item_tags: list[list[int]] | None = None,
                    attr_sizes: list[int] | None = None):
    from hvd_ctsm import distributed
    model = SequenceSaleModel(num_items, max_len, item_tags=item_tags, attr_sizes=attr_sizes)
    width = attrs_width(len(attr_sizes or []))
    return distributed.torch_estimator(
        num_proc=num_proc, store=distributed.spark_store(store_path), model=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=lr), loss=nn.BCELoss(),
        input_shapes=[[-1, max_len]] * len(HISTORY) + [[-1, max_len * width], [-1]],
        feature_cols=FEATURES,
        label_cols=[LABEL],
        batch_size=batch_size, epochs=epochs, verbose=0)


def fit_and_predict(spark, data: str, store: str, num_proc: int = 2, epochs: int = 2,
                    max_len: int = 20):
    """Fit on the train split's targets, transform the test split's; (model, predictions).
    The client attributes are used where the dataset names any, and the items' tags where it
    has them (a dataset built before tags existed
    trains on items alone)."""
    from hvd_ctsm.data.dataset_meta import item_tags, read_metadata

    meta = read_metadata(data)
    tags = item_tags(data, meta, required=False)
    estimator = build_estimator(store, meta.num_items, max_len, num_proc, epochs, item_tags=tags,
                                attr_sizes=meta.attr_sizes)
    fitted = estimator.fit(sequence_frame(spark, data, "train", max_len))
    return fitted, fitted.transform(sequence_frame(spark, data, "test", max_len))


def write_predictions(spark, data: str, store: str, out: str, overwrite: bool = False,
                      num_proc: int = 2, epochs: int = 2, max_len: int = 20) -> int:
    """fit_and_predict, the predictions written to OUT as Parquet; their row count.

    OUT is checked before any work: it may not overlap --data or --store, and an existing OUT
    is replaced only with `overwrite` and only when an earlier run of this command wrote it
    (hvd_ctsm.files.outputs). A local OUT is built in a temporary sibling and swapped into place, so
    a failed run leaves the old one whole; a URL OUT is written once, never replaced."""
    inputs = (data, store)
    if storage.is_remote(out):
        outputs.check_new_url(out, inputs)
        _, predictions = fit_and_predict(spark, data, store, num_proc, epochs, max_len)
        predictions.write.mode("errorifexists").parquet(out)
        return spark.read.parquet(out).count()
    outputs.check_not_an_input(store, [data])
    with outputs.staged(out, overwrite, "predictions", inputs) as stage:
        _, predictions = fit_and_predict(spark, data, store, num_proc, epochs, max_len)
        predictions.write.mode("append").parquet(str(stage.resolve()))  # stage holds our marker
        rows = spark.read.parquet(str(stage.resolve())).count()
    return rows


def at_least_one(text: str) -> int:
    """A whole number >= 1 (0 crashed deep in Spark, Horovod or torch, exit 3)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    p = arg_parser("hvd_ctsm.train.estimator", __doc__.splitlines()[0])
    p.add_argument("--data", type=location, required=True, help="feature job output folder")
    p.add_argument("--store", required=True, help="Store folder (local, hdfs://, /dbfs/)")
    p.add_argument("--out", type=location, required=True,
                   help="predictions of the test split (Parquet folder)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an OUT that an earlier run of this command wrote")
    p.add_argument("--num-proc", type=at_least_one, default=2, help="training ranks (tasks)")
    p.add_argument("--epochs", type=at_least_one, default=2)
    p.add_argument("--max-len", type=at_least_one, default=20,
                   help="history length fed to the model")
    p.add_argument("--master", default=None, help="Spark master (default local[NUM_PROC])")
    args = p.parse_args(argv)
    from hvd_ctsm.data.dataset_meta import DatasetError, read_metadata
    from hvd_ctsm.spark_session import get_spark

    try:
        read_metadata(args.data)  # a missing or damaged dataset stops before Spark starts
        spark = get_spark(master=args.master or f"local[{args.num_proc}]",
                          app_name="hvd_ctsm-est")
        rows = write_predictions(spark, args.data, args.store, args.out, args.overwrite,
                                 args.num_proc, args.epochs, args.max_len)
    except (DatasetError, FileExistsError, StorageError) as exc:
        print(f"hvd_ctsm.train.estimator: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps({"predictions": rows, "out": args.out}))
    return 0


if __name__ == "__main__":
    from hvd_ctsm.errors import run_cli

    sys.exit(run_cli(main, "hvd_ctsm.train.estimator"))
