"""Batch scoring: the top-K items for every client from a deployed model, as Parquet.

    python -m hvd_ctsm.serving.score --data FEATURES --model REGISTRY --out scores.parquet --k 10
    spark-submit spark_jobs/score_topk.py ...      # the same, distributed (same options)

--model takes a registry (its `current` version), a run folder, a model.pt or a registered
MLflow model (models:/ctsm@champion, models:/ctsm/3): the version's own files, from the store
--tracking-uri names, else MLFLOW_TRACKING_URI, else the default local store beside the features
(DATA/../mlflow). Each client is scored from its row in the feature dataset's `serving` split:
its latest events, all of them, so the state is the one after the client's newest event.
Features built before the serving split existed have none: scoring then falls back to the `test`
rows, whose histories stop before each client's last event (the held-out target), and logs a
warning saying to rebuild the features.
`--split test|validation` scores those rows on purpose (what the model would have recommended
at that time): they exclude only the items the client had before the held-out target
(`prior_items`), as the backtest's full ranking does, so a row's hit is the backtest's hit.
Otherwise items the client ever had (`client_items`, every event included) are never
recommended, and padding never is.
Output rows: client_id, rank (1..K), item_id (the raw id from vocab.json), item (its index),
score (next-item logit) and p_sale (when the model has that head). The Parquet file appears
whole or not at all (temp file, rename). A client with fewer than K items it may be recommended
gets them all and is counted as `short`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

from hvd_ctsm.data.batches import DatasetError, open_reader
from hvd_ctsm.data.dataset import Dataset
from hvd_ctsm.data.schema import SERVING_SPLIT
from hvd_ctsm.errors import arg_parser, run_cli
from hvd_ctsm.files import storage
from hvd_ctsm.files.atomic import atomic_write_bytes
from hvd_ctsm.files.outputs import (UnsafeOutputError, check_not_an_input, check_not_inside_a_whole,
                                    deployed_version)
from hvd_ctsm.files.storage import location
from hvd_ctsm.model.checkpoint import load_model, model_file
from hvd_ctsm.model.topk import client_states  # noqa: F401  (the scoring core, re-exported)
from hvd_ctsm.model.topk import score_rows
from hvd_ctsm.progress import with_progress

SCORE_COLUMNS = ("client_id", "rank", "item_id", "item", "score", "p_sale")
SCORABLE_SPLITS = (SERVING_SPLIT, "test", "validation")
log = logging.getLogger(__name__)


class ScoringError(ValueError):
    """The inputs cannot be scored together; the message says why and what to do."""


class ModelRefError(ScoringError):
    """A models:/ --model that names no registered version here (bad URI, model, alias or
    store); the message names the fix."""


def resolve_model(path: str | Path) -> Path:
    """A registry folder (its current version), a run folder or a model.pt -> the model.pt,
    which must exist."""
    found = model_file(path)
    if not found.exists():
        registry_like = Path(path).is_dir() and not (Path(path) / "config.yaml").exists()
        hint = " (a folder without `current`: a registry before its first deploy? run hvd-ctsm " \
            "deploy)" if registry_like else ""
        named = deployed_version(path) if Path(path).is_dir() else None
        if named is not None:
            hint = f" (its `current` names {named.name}, which holds no model.pt: deploy " \
                "again, or put back that version)"
        raise ScoringError(f"no model at {path}{hint}: pass a registry, a run folder or a "
                           "model.pt")
    return found


@contextlib.contextmanager
def model_source(model: str | Path, data: str | Path, tracking_uri: str = ""):
    """The model.pt to score with: resolve_model's, or for models:/NAME@ALIAS the registered
    version's own files, downloaded into a temporary folder for the duration of the block."""
    from hvd_ctsm import tracking
    if not tracking.is_model_uri(model):
        yield resolve_model(model)
        return
    with tempfile.TemporaryDirectory(prefix="hvd_ctsm-model-") as folder:
        try:
            version = tracking.download_model(str(model), tracking_uri, data, Path(folder))
        except ValueError as exc:
            raise ModelRefError(str(exc)) from None
        yield resolve_model(version)


def check_model_option(model: str | Path, option: str = "--model") -> None:
    """A model option takes a local path or a models:/ URI (model_source; the check:
    tracking.check_model_ref)."""
    from hvd_ctsm import tracking
    tracking.check_model_ref(model, option)


def model_inputs(data: str | Path, model: str | Path) -> tuple:
    """The command's inputs that an output must not overlap (a models:/ URI is no path)."""
    from hvd_ctsm import tracking
    return (data,) if tracking.is_model_uri(model) else (data, model)


def vocab_items(dataset: Dataset, model_state: dict) -> list[str]:
    """Raw item ids by index, from the dataset's vocab.json, checked against the model's."""
    dataset.check_model(model_state, "the model",
                        "score with the features it was trained on (or retrain)")
    return dataset.items()


def excluded_items(split: str | None) -> str:
    """The row field of items not to recommend: for a --split test|validation asked for, those
    before the target (the backtest's mask); else every item the client had (a fallback to the
    test rows included: those recommendations stand in for serving ones)."""
    return "prior_items" if split in ("test", "validation") else "client_items"


def scoring_split(dataset: Dataset, split: str | None = None) -> str:
    """The split to score from: `split` when given, else `serving`, else (features built before
    serving rows existed) `test`, with a warning: its histories miss each client's last event."""
    data, written = dataset.path, dataset.meta.splits
    if split is None:
        if SERVING_SPLIT in written:
            return SERVING_SPLIT
        log.warning("%s has no %r split (built before it existed): scoring from the test rows, "
                    "whose histories stop before each client's last event, so recommendations "
                    "ignore it; rebuild the features with spark_jobs.build_features to score "
                    "from every event", data, SERVING_SPLIT)
        split = "test"
    if split not in SCORABLE_SPLITS:
        raise ScoringError(f"cannot score from {split!r}: pick one of {SCORABLE_SPLITS} (one row "
                           "per client)")
    if split not in written:
        raise ScoringError(f"{data} has no {split!r} split to score from (it has "
                           f"{sorted(written)}): rebuild the features with "
                           "spark_jobs.build_features, or pick another --split")
    return split


def arrow_table(records: list[tuple]):
    import pyarrow as pa

    columns = list(zip(*records, strict=True)) if records else [[] for _ in SCORE_COLUMNS]
    types = [pa.string(), pa.int32(), pa.string(), pa.int32(), pa.float32(), pa.float32()]
    return pa.table({name: pa.array(col, type=t)
                     for name, col, t in zip(SCORE_COLUMNS, columns, types, strict=True)})


def write_parquet_atomic(table, path: Path) -> None:
    import pyarrow.parquet as pq


    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def check_score_file(out: str | Path, inputs) -> None:
    """`out` may be written: not an input, not a folder, and if it exists, an earlier scores
    file (our columns): replacing it must never cost anything else. `out` may be a URL."""

    if storage.is_remote(out):
        if any(str(out).rstrip("/").startswith(str(i).rstrip("/")) for i in inputs if i):
            raise UnsafeOutputError(f"refusing to write {out}: it lies inside an input; pick an "
                                    "--out outside every input")
    else:
        check_not_an_input(storage.local_path(out), inputs)
        check_not_inside_a_whole(storage.local_path(out))
    if storage.is_dir(out):
        raise UnsafeOutputError(f"{out} is a folder: --out names the Parquet file to write")
    if storage.exists(out) and storage.parquet_columns(out) != SCORE_COLUMNS:
        raise UnsafeOutputError(f"refusing to replace {out}: it is not a scores file "
                                "written by hvd_ctsm.serving.score; pick another --out")


def write_scores(table, out: str | Path) -> None:
    """The scores file, whole or not at all, on the local disk or at a URL."""
    if storage.is_remote(out):
        import pyarrow.parquet as pq

        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        storage.write_bytes_atomic(str(out), buffer.getvalue())
    else:
        write_parquet_atomic(table, storage.local_path(out))


def summarize(records: list[tuple], clients: int, k: int) -> dict:
    per_client: dict[str, int] = {}
    for record in records:
        per_client[record[0]] = per_client.get(record[0], 0) + 1
    return {"clients": clients, "scored_clients": len(per_client), "rows": len(records),
            "short": sum(1 for n in per_client.values() if n < k), "k": k}


def score_dataset(data: str | Path, model_path: str | Path, out: str | Path, k: int = 10,
                  split: str | None = None, tracking_uri: str = "") -> dict:
    """Score every client of `data`'s split (default: scoring_split) with the model (a path or
    a models:/ URI, see model_source); write `out`; return a summary (which names the split)."""

    if k < 1:
        raise ScoringError(f"k must be >= 1, got {k}")
    check_model_option(model_path)
    t0 = time.perf_counter()
    check_score_file(out, model_inputs(data, model_path))
    dataset = Dataset.open(data)
    exclude = excluded_items(split)
    split = scoring_split(dataset, split)
    url = dataset.split(split)  # a damaged or incomplete dataset stops here
    with model_source(model_path, data, tracking_uri) as path:
        model, state = load_model(path)
    items = vocab_items(dataset, state)
    with open_reader(url, 0, 1, seed=None, shuffle=False) as reader:
        rows = list(reader)
    records = list(score_rows(model, with_progress(rows, len(rows), "score", "clients scored"),
                              k, items, exclude=exclude))
    write_scores(arrow_table(records), out)
    return summarize(records, len(rows), k) | {"split": split, "out": str(out),
                                                "seconds": round(time.perf_counter() - t0, 2)}


def scoring_parser(prog: str, description: str, out: str) -> argparse.ArgumentParser:
    """The options both scorers take (this one and spark_jobs/score_topk.py); `out` says what
    --out is for that scorer."""
    p = arg_parser(prog, description)
    p.add_argument("--data", type=location, required=True,
                   help="feature job output folder or URL (s3://...)")
    p.add_argument("--model", type=location, required=True,
                   help="registry, run folder, model.pt or models:/NAME@ALIAS (MLflow)")
    p.add_argument("--tracking-uri", default="",
                   help="the MLflow store of a models:/ --model (default MLFLOW_TRACKING_URI, "
                        "else DATA/../mlflow/mlflow.db)")
    p.add_argument("--out", type=location, required=True, help=out)
    p.add_argument("--k", type=int, default=10, help="items per client (default 10)")
    p.add_argument("--split", default=None, choices=SCORABLE_SPLITS,
                   help="the rows to score from (default serving: every client's latest events; "
                        "test for features built before the serving split, with a warning); "
                        "test|validation exclude only the items before each target, as the "
                        "backtest does")
    p.add_argument("--json", action="store_true",
                   help="say what was scored as one JSON line (for scripts), not a sentence")
    return p


def say_scored(summary: dict, as_json: bool) -> None:
    """What a scorer did, on stdout: a sentence, or (--json) the summary as one JSON line."""
    if as_json:
        print(json.dumps(summary))
        return
    where = summary.get("table") or summary.get("out", "")
    took = f" in {summary['seconds']:.1f} s" if "seconds" in summary else ""
    line = (f"scored {summary['scored_clients']:,} of {summary['clients']:,} clients from the "
            f"{summary.get('split', 'serving')} split, top-{summary['k']} each "
            f"({summary['rows']:,} rows), into {where}{took}")
    if summary["short"]:
        line += (f"; {summary['short']:,} of them got fewer than {summary['k']} (every item "
                 "they had not seen)")
    print(line)


def main(argv: list[str] | None = None) -> int:
    p = scoring_parser("hvd-ctsm score", __doc__.splitlines()[0],
                       "Parquet file to write (a path or a URL)")
    args = p.parse_args(argv)
    try:
        summary = score_dataset(args.data, args.model, args.out, args.k, args.split,
                                args.tracking_uri)
    except (ScoringError, DatasetError) as exc:  # bad input: one line, exit 2 (hvd_ctsm.errors)
        print(f"hvd-ctsm score: error: {exc}", file=sys.stderr)
        return 2
    say_scored(summary, args.json)
    return 0


def cli() -> None:

    sys.exit(run_cli(main, "hvd-ctsm score"))


if __name__ == "__main__":
    cli()
