"""Writing: datasets with enough row groups, JSON files and the output folder, atomically.

A dataset is Parquet in Petastorm's layout. Where Petastorm is installed it also writes its
`_common_metadata` (its Unischema and row-group counts), so Petastorm's own tools read it; where
it is not (current stacks: it does not run on pyarrow >= 15), the same files and an equivalent
`_common_metadata` are written without it (hvd_ctsm.data.petastorm_metadata).
HVD_CTSM_WRITER=parquet
skips Petastorm anyway. Our reader (hvd_ctsm.data.arrow_reader) needs only the files.

The readers shard by row group, so a split with fewer row groups than ranks leaves some ranks
without rows (and Horovod ranks that disagree on their step counts hang). Each split is therefore
repartitioned into at least `row_groups` non-empty files (one row group or more each).
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from hvd_ctsm.files.atomic import atomic_write_bytes

ROW_GROUP_SIZE_MB = 32  # big partitions get several row groups: more shards, never fewer


# A total order of a split's rows: rows with equal keys are equal rows, so files hold the same
# rows in the same order on every run.
ROW_ORDER = ("client_id", "timestamp", "target_time")


def count_row_groups(path: str | Path) -> int:
    """Row groups over all Parquet files of a dataset folder (read from the footers)."""
    return sum(pq.ParquetFile(f).num_row_groups for f in sorted(Path(path).glob("*.parquet")))


def petastorm_writes() -> bool:
    """Whether Petastorm writes its metadata beside the files (installed, and not turned off)."""
    if os.environ.get("HVD_CTSM_WRITER", "auto") == "parquet":
        return False
    try:
        import petastorm.etl.dataset_metadata  # noqa: F401
    except ImportError:
        return False
    return True


def write_dataset(df: DataFrame, path: Path, n_rows: int, row_groups: int) -> int:
    """Write `df` (the schema's columns, already encoded) as a dataset; return row groups.

    Deterministic: file f gets the rows numbered [f * n / files, (f + 1) * n / files) in
    ROW_ORDER, sorted inside the file (`_placed`); files are then renamed
    part-00000.parquet, ... So the same input gives the same files holding the same rows in the
    same order (round-robin repartitioning dealt rows differently on every run). With fewer
    rows than `row_groups` the split gets one row per file (all that is possible).
    """
    files = max(1, min(row_groups, n_rows))
    # Not as_uri(): Hadoop takes "%20" in a file: URL literally (a folder named "my%20out"),
    # where it parses the plain path, spaces and commas too.
    url = f"file://{path.resolve()}"
    with _metadata_writer(df.sparkSession, url):
        _placed(df, files, n_rows).write.mode("overwrite").parquet(url)
        _stable_names(path)
    if not petastorm_writes():  # the metadata Petastorm's readers need, by our own code
        from hvd_ctsm.data.petastorm_metadata import write_common_metadata

        write_common_metadata(path)
    groups = count_row_groups(path)
    if groups < files:  # would leave Horovod ranks without rows: never publish that
        raise RuntimeError(f"{path.name}: wrote {groups} row groups, expected at least {files}")
    return groups


# What Petastorm's materialize_dataset sets on Hadoop's configuration for the write (row groups of
# ROW_GROUP_SIZE_MB, checked from the 3rd row; no summary files): the files are the same with it
# or without it.
PARQUET_SETTINGS = {"parquet.summary.metadata.level": "NONE",
                    "parquet.summary.metadata.propagate-errors": "true",
                    "parquet.block.size.row.check.min": "3",
                    "parquet.row-group.size.row.check.min": "3",
                    "parquet.block.size": str(ROW_GROUP_SIZE_MB * 1024 * 1024)}


@contextmanager
def _metadata_writer(spark, url: str):
    """Petastorm's materialize_dataset where it writes, else the same Hadoop settings, restored
    after."""
    if petastorm_writes():
        from petastorm.etl.dataset_metadata import materialize_dataset

        from hvd_ctsm.data.schema import make_schema

        with materialize_dataset(spark, url, make_schema(), ROW_GROUP_SIZE_MB):
            yield
        return
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    before = {key: hadoop.get(key) for key in PARQUET_SETTINGS}
    for key, value in PARQUET_SETTINGS.items():
        hadoop.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                hadoop.unset(key)
            else:
                hadoop.set(key, value)


def _placed(df: DataFrame, files: int, n_rows: int) -> DataFrame:
    """`df` in `files` partitions, partition f holding the rows numbered [f * n / files,
    (f + 1) * n / files) in ROW_ORDER, sorted.

    All in Spark's JVM, no row through Python: the clients' row counts (sorted on the driver) give
    where each file starts, as a client and a rank among that client's rows; only the clients
    where a file starts (at most files - 1) need their rows ranked. Rows with equal keys are
    equal rows, so ties may rank either way without changing what a file holds.
    """
    if files == 1:
        return df.repartition(1).sortWithinPartitions(*ROW_ORDER)
    starts = _file_starts(df, files, n_rows)
    cut_clients = sorted({client for client, _ in starts})
    at_cut = F.col("client_id").isin(cut_clients)
    ranked = df.filter(at_cut).withColumn("_rank", F.row_number().over(
        Window.partitionBy("client_id").orderBy(*ROW_ORDER[1:])) - 1)
    rows = df.filter(~at_cut).withColumn("_rank", F.lit(0)).unionByName(ranked)
    file = sum(((F.col("client_id") > client)  # file f starts at starts[f - 1]
                | ((F.col("client_id") == client) & (F.col("_rank") >= rank))).cast("int")
               for client, rank in starts)
    slot = F.element_at(F.array(*[F.lit(k) for k in _partition_keys(df.sparkSession, files)]),
                        file + 1)
    return (rows.withColumn("_slot", slot).repartition(files, "_slot")
            .sortWithinPartitions(*ROW_ORDER).drop("_slot", "_rank"))


def _file_starts(df: DataFrame, files: int, n_rows: int) -> list[tuple[str, int]]:
    """(client, rank among its rows) of the first row of files 1 .. files - 1."""
    # Sorted here, not by Spark (one shuffle less): Python orders str by code point, Spark orders
    # strings by their UTF-8 bytes, and UTF-8 keeps code point order.
    counts = df.groupBy("client_id").count().toPandas().sort_values("client_id")
    if int(counts["count"].sum()) != n_rows:
        raise RuntimeError(f"row accounting: {n_rows} rows expected, "
                           f"{int(counts['count'].sum())} counted")
    return file_starts(counts["client_id"].tolist(), counts["count"].tolist(), files)


def file_starts(clients: list[str], counts: list[int], files: int) -> list[tuple[str, int]]:
    """Where files 1 .. files - 1 start, given each client's row count in ROW_ORDER: file f
    starts at row ceil(f * n / files), the first row i with i * files // n == f."""
    n_rows, starts, c, before = sum(counts), [], 0, 0
    for f in range(1, files):
        first = -(-f * n_rows // files)
        while before + counts[c] <= first:
            before, c = before + counts[c], c + 1
        starts.append((clients[c], first - before))
    return starts


def _partition_keys(spark, files: int) -> list[int]:
    """For each f < files, an int that Spark's `repartition(files, column)` sends to partition
    f (it hashes with Murmur3, seed 42, as F.hash does), so that file f is partition f."""
    if files not in _PARTITION_KEYS:
        ints = spark.range(64 * files).select(F.col("id").cast("int").alias("k"))
        found = (ints.select("k", F.pmod(F.hash("k"), F.lit(files)).alias("p"))
                 .groupBy("p").agg(F.min("k").alias("k")).collect())
        keys = {row["p"]: row["k"] for row in found}
        if len(keys) != files:  # 64 tries a partition: not seen in practice
            raise RuntimeError(f"no key for {files - len(keys)} of {files} partitions")
        _PARTITION_KEYS[files] = [keys[f] for f in range(files)]
    return _PARTITION_KEYS[files]


_PARTITION_KEYS: dict[int, list[int]] = {}  # Spark's hash is fixed: one Spark job per count


def _stable_names(path: Path) -> None:
    """part-00003-<job uuid>-c000.snappy.parquet -> part-00003.parquet (same on every run)."""
    for part in sorted(path.glob("part-*.parquet")):
        part.rename(part.with_name(f"{part.name[:10]}.parquet"))


def file_listing(path: Path) -> list[dict]:
    """[{name, rows, bytes}] of a split's Parquet files, for readers to check (metadata.json)."""
    return [{"name": f.name, "rows": pq.ParquetFile(f).metadata.num_rows,
             "bytes": f.stat().st_size} for f in sorted(path.glob("*.parquet"))]


def write_atomic(path: Path, data: bytes) -> None:
    """Readers never see half a file (temp file, fsync, rename: hvd_ctsm.files.atomic)."""
    atomic_write_bytes(path, data)


def write_json_atomic(path: Path, content: dict) -> None:
    write_atomic(path, (json.dumps(content, indent=1) + "\n").encode("utf-8"))
