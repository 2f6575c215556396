"""Writing: Petastorm datasets with enough row groups, JSON files and the output folder, atomically.

Petastorm shards by row group, so a split with fewer row groups than ranks leaves some ranks
without rows (and Horovod ranks that disagree on their step counts hang). Each split is therefore
repartitioned into at least `row_groups` non-empty files (one row group or more each).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import DataFrame

from hvd_ctsm.atomic import atomic_write_bytes

ROW_GROUP_SIZE_MB = 32  # big partitions get several row groups: more shards, never fewer


# A total order of a split's rows: rows with equal keys are equal rows, so files hold the same
# rows in the same order on every run.
ROW_ORDER = ("client_id", "timestamp", "target_time")


def count_row_groups(path: str | Path) -> int:
    """Row groups over all Parquet files of a dataset folder (read from the footers)."""
    return sum(pq.ParquetFile(f).num_row_groups for f in sorted(Path(path).glob("*.parquet")))


def write_petastorm(df: DataFrame, path: Path, n_rows: int, row_groups: int) -> int:
    """Write `df` (Unischema columns, already encoded) as a Petastorm dataset; return row groups.

    Deterministic: rows are sorted (ROW_ORDER), numbered, and file f gets the rows numbered
    [f * n / files, (f + 1) * n / files), sorted again inside the file; files are then renamed
    part-00000.parquet, ... So the same input gives the same files holding the same rows in the
    same order (round-robin repartitioning dealt rows differently on every run). With fewer
    rows than `row_groups` the split gets one row per file (all that is possible).
    """
    from petastorm.etl.dataset_metadata import materialize_dataset

    from spark_jobs.sequences import unischema

    files = max(1, min(row_groups, n_rows))
    url = path.resolve().as_uri()
    with materialize_dataset(df.sparkSession, url, unischema(), ROW_GROUP_SIZE_MB):
        _placed(df, files, n_rows).write.mode("overwrite").parquet(url)
        _stable_names(path)
    groups = count_row_groups(path)
    if groups < files:  # would leave Horovod ranks without rows: never publish that
        raise RuntimeError(f"{path.name}: wrote {groups} row groups, expected at least {files}")
    return groups


def _placed(df: DataFrame, files: int, n_rows: int) -> DataFrame:
    """`df` in `files` partitions, each a contiguous, sorted slice of the rows in ROW_ORDER."""
    numbered = df.orderBy(*ROW_ORDER).rdd.zipWithIndex()
    keyed = numbered.map(lambda pair: (pair[1] * files // n_rows, pair[0]))
    placed = keyed.partitionBy(files, lambda f: f).values()
    return df.sparkSession.createDataFrame(placed, df.schema).sortWithinPartitions(*ROW_ORDER)


def _stable_names(path: Path) -> None:
    """part-00003-<job uuid>-c000.snappy.parquet -> part-00003.parquet (same on every run)."""
    for part in sorted(path.glob("part-*.parquet")):
        part.rename(part.with_name(f"{part.name[:10]}.parquet"))


def file_listing(path: Path) -> list[dict]:
    """[{name, rows, bytes}] of a split's Parquet files, for readers to check (metadata.json)."""
    return [{"name": f.name, "rows": pq.ParquetFile(f).metadata.num_rows,
             "bytes": f.stat().st_size} for f in sorted(path.glob("*.parquet"))]


def write_atomic(path: Path, data: bytes) -> None:
    """Readers never see half a file (temp file, fsync, rename: hvd_ctsm.atomic)."""
    atomic_write_bytes(path, data)


def write_json_atomic(path: Path, content: dict) -> None:
    write_atomic(path, (json.dumps(content, indent=1) + "\n").encode("utf-8"))
