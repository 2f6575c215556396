"""Writing: Petastorm datasets with enough row groups, JSON files and the output folder, atomically.

Petastorm shards by row group, so a split with fewer row groups than ranks leaves some ranks
without rows (and Horovod ranks that disagree on their step counts hang). Each split is therefore
repartitioned into at least `row_groups` non-empty files (one row group or more each).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import DataFrame

from hvd_ctsm.atomic import atomic_write_bytes

ROW_GROUP_SIZE_MB = 32  # big partitions get several row groups: more shards, never fewer


class OutputExistsError(FileExistsError):
    """The output folder exists and overwrite was not asked for."""


def count_row_groups(path: str | Path) -> int:
    """Row groups over all Parquet files of a dataset folder (read from the footers)."""
    return sum(pq.ParquetFile(f).num_row_groups for f in sorted(Path(path).glob("*.parquet")))


def write_petastorm(df: DataFrame, path: Path, n_rows: int, row_groups: int) -> int:
    """Write `df` (Unischema columns, already encoded) as a Petastorm dataset; return row groups.

    Round-robin repartitioning deals each input partition's rows to consecutive files from a
    random start, so an input partition with fewer rows than files can leave gaps: small splits are
    first coalesced into one partition, which then fills every file. With fewer rows than
    `row_groups` the split gets one row per file (all that is possible).
    """
    from petastorm.etl.dataset_metadata import materialize_dataset

    from spark_jobs.sequences import unischema

    files = max(1, min(row_groups, n_rows))
    if n_rows < 2 * files * df.rdd.getNumPartitions():
        df = df.coalesce(1)
    url = path.resolve().as_uri()
    with materialize_dataset(df.sparkSession, url, unischema(), ROW_GROUP_SIZE_MB):
        df.repartition(files).write.mode("overwrite").parquet(url)
    groups = count_row_groups(path)
    if groups < files:  # would leave Horovod ranks without rows: never publish that
        raise RuntimeError(f"{path.name}: wrote {groups} row groups, expected at least {files}")
    return groups


def write_atomic(path: Path, data: bytes) -> None:
    """Readers never see half a file (temp file, fsync, rename: hvd_ctsm.atomic)."""
    atomic_write_bytes(path, data)


def write_json_atomic(path: Path, content: dict) -> None:
    write_atomic(path, (json.dumps(content, indent=1) + "\n").encode("utf-8"))


def staging_dir(out: Path, overwrite: bool) -> Path:
    """A fresh temporary sibling of `out` to build the whole output in (checked before work)."""
    if out.exists() and not overwrite:
        raise OutputExistsError(f"output {out} exists; pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = out.with_name(f".{out.name}.tmp-{uuid.uuid4().hex[:8]}")
    stage.mkdir()
    return stage


def publish(stage: Path, out: Path) -> None:
    """Move the finished output into place; an old output is removed only after the swap."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(out, old)
    os.replace(stage, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def discard(stage: Path) -> None:
    shutil.rmtree(stage, ignore_errors=True)
