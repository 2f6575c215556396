"""The notebook API: the pipeline's steps as functions that take an existing SparkSession.

    from hvd_ctsm.api import backtest_model, make_features, score_clients, train_model

    meta = make_features(spark, "synthetic:clients=1000,events=50000", "/dbfs/ctsm/features")
    summary = train_model(spark, "/dbfs/ctsm/features", "/dbfs/ctsm/run", num_proc=4, epochs=5)
    report = backtest_model("/dbfs/ctsm/features", "/dbfs/ctsm/run", gate="ndcg@10>=0.05")
    scores = score_clients(spark, "/dbfs/ctsm/features", "/dbfs/ctsm/run", "/dbfs/ctsm/scores")

The names are the notebook's own: no module of the package is called make_features, train_model,
backtest_model or score_clients. This is the top layer (it may import anything, nothing imports
it); it imports nothing heavy until a function runs, so torch, Spark and Horovod load on use.
"""

from __future__ import annotations


def make_features(spark, source: str, out: str, **options) -> dict:
    """The Spark feature job in `spark`; options are FeatureConfig fields (split, max_len,
    row_groups, previous_vocab, overwrite, ...). Returns the dataset's metadata."""
    from spark_jobs.build_features import build_features as run
    from spark_jobs.config import FeatureConfig

    return run(spark, FeatureConfig(source=source, out=str(out), **options))


def train_model(spark, data: str, out: str, num_proc: int = 2, config: str = "default",
                epochs: int | None = None, overrides: list[str] | tuple = (),
                init_from: str | None = None, overwrite: bool = True) -> dict:
    """Train with horovod.spark on `num_proc` tasks of `spark`; returns train_summary.json.

    overrides: trainer settings as 'section.field=value' (e.g. 'model.dim=32');
    init_from: a model.pt (or registry version) to warm-start from."""
    from hvd_ctsm.config import load_config
    from hvd_ctsm.serving.score import resolve_model
    from hvd_ctsm.train.launch import LaunchOptions
    from hvd_ctsm.train.spark_train import train_on_spark

    epochs_override = [] if epochs is None else [f"epochs={epochs}"]
    cfg = load_config(config, [*overrides, f"data.path={data}", f"out={out}", *epochs_override])
    options = LaunchOptions(overwrite=overwrite,
                            init_from=str(resolve_model(init_from)) if init_from else None)
    return train_on_spark(cfg, num_proc=num_proc, spark=spark, options=options)


def backtest_model(data: str, model: str, gate: str = "", report: str | None = None,
                   split: str = "test") -> dict:
    """Offline evaluation against popularity, with the gate applied when one is given
    (report['gate']['passed']); written to `report` (JSON) when a path is given."""
    from hvd_ctsm.evaluation.backtest import run_backtest
    from hvd_ctsm.evaluation.gate import decide, parse_gate

    rules = parse_gate(gate)
    result = run_backtest(str(data), str(model), split)
    decide(result, rules, None, 0.0, report, "backtest", echo=False)
    return result


def score_clients(spark, data: str, model: str, out: str, k: int = 10,
                  overwrite: bool = False, tracking_uri: str = "") -> dict:
    """Top-K unseen items per client as Parquet: on the cluster with a SparkSession (a folder),
    in this process with spark=None (one file). `model`: registry, run folder, model.pt or
    models:/NAME@ALIAS (from `tracking_uri`, else MLFLOW_TRACKING_URI, else DATA/../mlflow)."""
    if spark is None:
        from hvd_ctsm.serving.score import score_dataset

        return score_dataset(data, model, out, k, tracking_uri=tracking_uri)
    from spark_jobs.score_topk import score_topk

    return score_topk(spark, str(data), str(model), str(out), k, overwrite=overwrite,
                      tracking_uri=tracking_uri)
