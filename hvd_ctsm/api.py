"""The notebook API: the pipeline's steps as functions that take an existing SparkSession.

    from hvd_ctsm import build_features, train, backtest, score

    meta = build_features(spark, "synthetic:clients=1000,events=50000", "/dbfs/ctsm/features")
    summary = train(spark, "/dbfs/ctsm/features", "/dbfs/ctsm/run", num_proc=4, epochs=5)
    report = backtest("/dbfs/ctsm/features", "/dbfs/ctsm/run", gate="ndcg@10>=0.05")
    scores = score(spark, "/dbfs/ctsm/features", "/dbfs/ctsm/run", "/dbfs/ctsm/scores", k=10)

`train`, `backtest` and `score` are also the names of modules of this package (`python -m
hvd_ctsm.train`, ...): those modules are made callable (calling one calls the function here), so
`hvd_ctsm.train.main` and `hvd_ctsm.train(spark, ...)` both work whichever was imported first.
This module imports nothing heavy at import time: spark_jobs imports the package without torch.
"""

from __future__ import annotations

import sys
import types


class _CallableModule(types.ModuleType):
    """A module whose call runs the notebook function of the same name in this module."""

    def __call__(self, *args, **kwargs):
        return getattr(sys.modules[__name__], self.__name__.rsplit(".", 1)[1])(*args, **kwargs)


def make_callable(module_name: str) -> None:
    """Let `from hvd_ctsm import NAME; NAME(...)` call the notebook function NAME."""
    sys.modules[module_name].__class__ = _CallableModule


def build_features(spark, source: str, out: str, **options) -> dict:
    """The Spark feature job in `spark`; options are FeatureConfig fields (split, max_len,
    row_groups, previous_vocab, overwrite, ...). Returns the dataset's metadata."""
    from spark_jobs.build_features import build_features as run
    from spark_jobs.config import FeatureConfig

    return run(spark, FeatureConfig(source=source, out=str(out), **options))


def train(spark, data: str, out: str, num_proc: int = 2, config: str = "default",
          epochs: int | None = None, overrides: list[str] | tuple = (),
          init_from: str | None = None, overwrite: bool = True) -> dict:
    """Train with horovod.spark on `num_proc` tasks of `spark`; returns train_summary.json.

    overrides: trainer settings as 'section.field=value' (e.g. 'model.dim=32');
    init_from: a model.pt (or registry version) to warm-start from."""
    from hvd_ctsm.spark_train import train_on_spark

    argv = ["--data", str(data), "--out", str(out), "--config", config, *overrides]
    if epochs is not None:
        argv += ["--epochs", str(epochs)]
    if init_from:
        from hvd_ctsm.score import resolve_model

        argv += ["--init-from", str(resolve_model(init_from))]
    if overwrite:
        argv.append("--overwrite")
    return train_on_spark(argv, num_proc=num_proc, spark=spark)


def backtest(data: str, model: str, gate: str = "", report: str | None = None,
             split: str = "test") -> dict:
    """Offline evaluation against popularity, with the gate applied when one is given
    (report['gate']['passed']); written to `report` (JSON) when a path is given."""
    import json
    from pathlib import Path

    from hvd_ctsm.atomic import atomic_write_bytes
    from hvd_ctsm.backtest import apply_gate, parse_gate, run_backtest

    rules = parse_gate(gate)
    result = run_backtest(str(data), str(model), split)
    result["gate"] = apply_gate(result["model"], rules, None, 0.0) if rules \
        else {"passed": None, "checks": []}
    if report:
        atomic_write_bytes(Path(report), json.dumps(result, indent=2).encode())
    return result


def score(spark, data: str, model: str, out: str, k: int = 10, overwrite: bool = False) -> dict:
    """Top-K unseen items per client as Parquet: on the cluster with a SparkSession (a folder),
    in this process with spark=None (one file). `model`: registry, run folder or model.pt."""
    if spark is None:
        from hvd_ctsm.score import score_dataset

        return score_dataset(data, model, out, k)
    from spark_jobs.score_topk import score_topk

    return score_topk(spark, str(data), str(model), str(out), k, overwrite=overwrite)
