"""Batch scoring on Spark: the top-K items for every client, into a Parquet folder or a table.

The scores go into a Parquet folder or a table of the session's catalog.

    spark-submit spark_jobs/score_topk.py --data FEATURES --model REGISTRY --out SCORES --k 10
    spark-submit spark_jobs/score_topk.py --data FEATURES --model models:/ctsm@champion ...
    spark-submit spark_jobs/score_topk.py ... --out table:main.recsys.ctsm_scores
    score_topk(spark, data, model, out, k=10)        # from a notebook with its own session

The same scoring as `hvd-ctsm score` (hvd_ctsm.serving.score.score_rows), spread over the
partitions of the feature dataset: the model's bytes are broadcast once and each partition loads
the model, decodes its Petastorm rows and yields its clients' top-K. A registered MLflow model
(models:/NAME@ALIAS, --tracking-uri) is scored the same way: the driver downloads the version's
own files (hvd_ctsm.serving.score.model_source) and broadcasts its model.pt. Rows come from the
`serving` split (every client's latest events) or, for features built before it existed, from
the `test` split with a warning (hvd_ctsm.serving.score.scoring_split); `--split
test|validation` exclude only the items before each target, as the backtest does. The output
folder is built under a temporary name and renamed into place when complete. `--out table:NAME`
writes a table of the session's catalog instead (Unity Catalog's `catalog.schema.table` on
Databricks), written by one Spark job; an existing table is replaced only with --overwrite.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pyspark.errors import AnalysisException

from hvd_ctsm.data.arrow_reader import spark_rows
from hvd_ctsm.data.dataset import Dataset
from hvd_ctsm.errors import BAD_INPUT_ERRORS, EXIT_BAD_INPUT, EXIT_CRASH, one_line, run_cli
from hvd_ctsm.files import outputs, storage
from hvd_ctsm.model.checkpoint import load_state
from hvd_ctsm.serving.score import (ScoringError, check_model_option, excluded_items, model_inputs,
                                    model_source, say_scored, scoring_parser, scoring_split,
                                    vocab_items)
from spark_jobs.session import ExecutorPythonError, check_executors, get_spark, job_settings

TABLE = "table:"  # --out table:NAME: a table of the session's catalog
OUTPUT_SCHEMA = ("client_id string, rank int, item_id string, item int, score float, "
                 "p_sale float")


def _partition_scorer(model_bytes, items, k: int, exclude: str):
    """A mapPartitions function: load the model once per partition, score its rows."""

    def score_partition(rows):
        import io

        import torch

        from hvd_ctsm.model.ctsm import CTSM
        from hvd_ctsm.serving.score import score_rows

        torch.set_num_threads(1)  # one partition per core already
        state = torch.load(io.BytesIO(model_bytes.value), map_location="cpu", weights_only=True)
        yield from score_rows(CTSM.from_checkpoint(state), rows, k, items.value,
                              exclude=exclude)

    return score_partition


def score_topk(spark, data: str, model: str, out: str, k: int = 10, split: str | None = None,
               overwrite: bool = False, tracking_uri: str = "") -> dict:
    """Score every client of the split (default: scoring_split) on the cluster with the model
    (a registry, run folder, model.pt or models:/ URI); write OUT (Parquet); return a summary
    (which names the split scored)."""
    if k < 1:
        raise ScoringError(f"k must be >= 1, got {k}")
    check_options(model, out)
    t0 = time.time()
    dataset = Dataset.open(data)
    exclude = excluded_items(split)
    split = scoring_split(dataset, split)
    with model_source(model, data, tracking_uri) as path:
        summary = _score_model(spark, dataset, model, path, out, k, (split, exclude), overwrite)
    return summary | {"split": split, "out": str(out), "seconds": round(time.time() - t0, 2)}


def check_options(model: str, out: str) -> None:
    """The model and a folder --out are local (a models:/ model aside): a URL --out was built
    as a local folder named `s3:`, a URL model was found missing after Spark had started."""
    check_model_option(model)
    if not out.startswith(TABLE):
        storage.check_local(out, "--out", "table:NAME")


def _score_model(spark, dataset, model: str, path: Path, out: str, k: int,
                 rows: tuple[str, str], overwrite: bool) -> dict:
    """Score with the model file `path` (what `model` resolved to) into OUT, built in a stage;
    `rows` is the split to score and the row field of items to exclude (excluded_items)."""
    split, exclude = rows
    url = dataset.split(split)  # a damaged or incomplete dataset stops here
    if out.startswith(TABLE):
        return _score_table(spark, dataset, path, (url, exclude), out.removeprefix(TABLE), k,
                            overwrite)
    with outputs.staged(out, overwrite, "scores", model_inputs(dataset.path, model)) as stage:
        items = vocab_items(dataset, load_state(path))  # checks the model's checksum, vocab
        check_executors(spark)
        folder = str(stage.resolve())  # the stage holds our marker: append beside it
        with job_settings(spark):
            summary = _score_into(spark, (url, exclude), path, items, k,
                                  lambda scores: scores.write.mode("append").parquet(folder),
                                  lambda: spark.read.parquet(folder))
    return summary


def _score_table(spark, dataset, path: Path, source: tuple[str, str], table: str, k: int,
                 overwrite: bool) -> dict:
    """Score into the catalog table `table`, written by one Spark job (saveAsTable): a failed
    job creates no table, and an existing one is replaced only with `overwrite`."""
    if not table:
        raise ScoringError("--out table: needs a table name: table:NAME (catalog.schema.table)")
    if _table_exists(spark, table) and not overwrite:
        raise ScoringError(f"table {table} exists: pass --overwrite to replace it, or name "
                           "another table")
    items = vocab_items(dataset, load_state(path))
    check_executors(spark)
    mode = "overwrite" if overwrite else "errorifexists"

    def save(scores) -> None:
        try:
            scores.write.saveAsTable(table, mode=mode)
        except Exception as exc:
            if "LOCATION_ALREADY_EXISTS" not in str(exc):
                if isinstance(exc, AnalysisException):  # e.g. SCHEMA_NOT_FOUND: in its words
                    raise ScoringError(f"table {table}: Spark cannot create it ({_first(exc)}):"
                                       " check that its schema (database) exists and that you "
                                       "may create tables in it") from None
                raise
            # A catalog that forgets its tables when the application ends (Spark's local
            # default, in-memory) leaves their folders behind; the folder is not ours to remove.
            raise ScoringError(
                f"table {table}: the catalog has no such table but its folder exists (left by "
                "an earlier application whose catalog did not keep the table: Spark's in-memory "
                "default); remove that folder if it is disposable, name another table, or use a "
                "session with a persistent metastore (Hive support, Unity Catalog)") from None

    with job_settings(spark):
        summary = _score_into(spark, source, path, items, k, save, lambda: spark.table(table))
    return summary | {"table": table}


def _table_exists(spark, table: str) -> bool:
    """Whether the catalog has `table`; a name Spark cannot parse is bad input, in one line
    (it was "crashed: ParseException")."""
    try:
        return spark.catalog.tableExists(table)
    except AnalysisException as exc:  # ParseException is one
        raise ScoringError(f"table:{table} is not a table name Spark takes ({_first(exc)}): "
                           "name it catalog.schema.table, with letters, digits and _") from None


def _first(exc: Exception) -> str:
    """The first line of a Spark error (its error class and message), at most 160 characters."""
    return " ".join(str(exc).strip().splitlines()[0].split())[:160] if str(exc).strip() else \
        type(exc).__name__


def _score_into(spark, source: tuple[str, str], path: Path, items: list, k: int, write,
                read) -> dict:
    """Score the split at `source` (its URL, the row field of items to exclude), `write` the
    scores (a DataFrame), `read` them back to count."""
    url, exclude = source
    sc = spark.sparkContext
    scorer = _partition_scorer(sc.broadcast(path.read_bytes()), sc.broadcast(items), k, exclude)
    rows = spark_rows(spark, url)
    write(spark.createDataFrame(rows.mapPartitions(scorer), OUTPUT_SCHEMA))
    written = read()
    counts = written.groupBy("client_id").count()
    return {"clients": rows.count(), "scored_clients": counts.count(), "rows": written.count(),
            "short": counts.filter(f"count < {k}").count(), "k": k}


def main(argv=None) -> int:
    p = scoring_parser("score_topk", __doc__.splitlines()[0],
                       "output Parquet folder, or table:NAME (a table of the session's catalog)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    args = p.parse_args(argv)
    check_options(args.model, args.out)  # before Spark starts
    spark = get_spark(master=args.master, app_name="hvd_ctsm-score")
    try:
        summary = score_topk(spark, args.data, args.model, args.out, args.k, args.split,
                             args.overwrite, args.tracking_uri)
    except ExecutorPythonError as exc:  # the executors' Python cannot run the job: 3
        print(f"score_topk: error: {exc}", file=sys.stderr)
        return EXIT_CRASH
    except BAD_INPUT_ERRORS as exc:  # bad input, models:/ URIs included: 2, as every program
        print(f"score_topk: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    say_scored(summary, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, "score_topk"))  # a crash: one line and exit 3 (--debug)
