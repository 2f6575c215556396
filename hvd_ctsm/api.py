"""The notebook API: the pipeline's steps as functions that take an existing SparkSession.

    from hvd_ctsm.api import backtest_model, make_features, score_clients, train_model

    v = "/Volumes/main/recsys/ctsm"   # a Unity Catalog volume (dbfs:/Volumes/... works too)
    meta = make_features(spark, "synthetic:clients=1000,events=50000", f"{v}/features")
    summary = train_model(spark, f"{v}/features", f"{v}/run", num_proc=4, epochs=5)
    report = backtest_model(f"{v}/features", f"{v}/run", gate="ndcg@10>=0.05")
    scores = score_clients(spark, f"{v}/features", f"{v}/run", f"{v}/scores")

The names are the notebook's own: no module of the package is called make_features, train_model,
backtest_model or score_clients. This is the top layer (it may import anything, nothing imports
it); it imports nothing heavy until a function runs, so torch, Spark and Horovod load on use.
Locations are taken as the command-line options take them (`hvd_ctsm.files.storage.location`).
An error names these functions' arguments (`pass overwrite=True`), not the command line's options.
"""

from __future__ import annotations

import functools
import re

from hvd_ctsm.files.storage import location

# The steps' errors speak the command line's language ("pass --overwrite"); a notebook passes
# keywords, so its errors name those instead (replaced in this order).
API_WORDS = ((" (--warm-start)", ""), ("--overwrite", "overwrite=True"),
             ("--resume", "resume=True"), ("--init-from", "init_from"),
             ("--previous-vocab ", "previous_vocab="), ("--previous-vocab", "previous_vocab"),
             ("--event-type ", "event_type="), ("--event-type", "event_type"))
ARGUMENT = re.compile(r"--(out|data|model|k|split|gate|report|config|epochs|tracking-uri)\b")


def in_api_words(function):
    """`function` with the command-line options its errors name put as its arguments."""
    @functools.wraps(function)
    def call(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            if exc.args and isinstance(exc.args[0], str):
                text = exc.args[0]
                for flag, keyword in API_WORDS:
                    text = text.replace(flag, keyword)
                text = ARGUMENT.sub(lambda m: f"`{m[1].replace('-', '_')}`", text)
                exc.args = (text, *exc.args[1:])
            raise
    return call


@in_api_words
def make_features(spark, source: str, out: str, **options) -> dict:
    """The Spark feature job in `spark`; options are FeatureConfig fields (split, max_len,
    row_groups, previous_vocab, overwrite, ...). Returns the dataset's metadata."""
    from spark_jobs.build_features import build_features as run
    from spark_jobs.config import FeatureConfig

    return run(spark, FeatureConfig(source=source, out=location(str(out)), **options))


@in_api_words
def train_model(spark, data: str, out: str, num_proc: int = 2, config: str | None = None,
                epochs: int | None = None, overrides: list[str] | tuple = (),
                init_from: str | None = None, overwrite: bool = False,
                resume: bool = False) -> dict:
    """Train on `num_proc` tasks of `spark` (horovod.spark where Horovod is installed, else
    TorchDistributor: dist.backend=auto); returns train_summary.json.

    config: a preset or YAML (default: 'default'; with resume, the run's own config.yaml);
    overrides: trainer settings as 'section.field=value' (e.g. 'model.dim=32');
    init_from: a model.pt (or registry version) to warm-start from;
    overwrite: start afresh in a run folder this project wrote (--overwrite); resume: go on from
    its latest checkpoint (--resume). A folder holding a run is refused without one of them."""
    from hvd_ctsm.files.storage import check_local
    from hvd_ctsm.serving.score import resolve_model
    from hvd_ctsm.train.launch import LaunchOptions, parse_command
    from hvd_ctsm.train.spark_train import train_on_spark

    if init_from:  # as --init-from: it said "no model at s3://..." instead
        check_local(str(init_from), "--init-from")
    # The command line's way to a config: --resume without --config takes the run's own
    argv = ["--data", location(str(data)), "--out", location(str(out)), *overrides,
            *(["--config", config] if config else []),
            *(["--epochs", str(epochs)] if epochs is not None else []),
            *(["--resume"] if resume else [])]
    cfg = parse_command(argv)[0]
    warm = str(resolve_model(location(str(init_from)))) if init_from else None
    options = LaunchOptions(resume=resume, overwrite=overwrite, init_from=warm)
    return train_on_spark(cfg, num_proc=num_proc, spark=spark, options=options)


@in_api_words
def backtest_model(data: str, model: str, gate: str = "", report: str | None = None,
                   split: str = "test") -> dict:
    """Offline evaluation against popularity, with the gate applied when one is given
    (report['gate']['passed']); written to `report` (JSON) when a path is given."""
    from hvd_ctsm.evaluation.backtest import run_backtest
    from hvd_ctsm.evaluation.gate import check_report_path, decide, parse_gate

    rules = parse_gate(gate)
    if report:  # before the work: only an earlier report may be replaced
        check_report_path(location(str(report)))
    result = run_backtest(location(str(data)), location(str(model)), split)
    decide(result, rules, None, 0.0, report and location(str(report)), "backtest", echo=False)
    return result


@in_api_words
def score_clients(spark, data: str, model: str, out: str, k: int = 10,
                  overwrite: bool = False, tracking_uri: str = "") -> dict:
    """Top-K unseen items per client as Parquet: on the cluster with a SparkSession (a folder),
    in this process with spark=None (one file). `model`: registry, run folder, model.pt or
    models:/NAME@ALIAS (from `tracking_uri`, else MLFLOW_TRACKING_URI, else DATA/../mlflow).
    overwrite: the Spark route's, for a scores folder or table that exists; the one file of
    spark=None replaces an earlier scores file (as `hvd-ctsm score` does), never another file."""
    data, model, out = (location(str(x)) for x in (data, model, out))
    if spark is None:
        from hvd_ctsm.serving.score import score_dataset

        return score_dataset(data, model, out, k, tracking_uri=tracking_uri)
    from spark_jobs.score_topk import score_topk

    return score_topk(spark, data, model, out, k, overwrite=overwrite, tracking_uri=tracking_uri)
