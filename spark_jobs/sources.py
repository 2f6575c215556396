"""Source readers. Each returns raw events plus optional attribute tables in one canonical form:

- events: client_id, item_id, timestamp, event_type, value (raw types; validate.py parses them)
- client_attrs: long form client_id (string), timestamp (long, null = known from the start),
  name, value (string)
- item_attrs: item_id (string), category (string), genres (string, "|"-separated), year (int,
  the release year; null = unknown)
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from py4j.protocol import Py4JJavaError
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from hvd_ctsm.files import storage
from spark_jobs import csv_files
from spark_jobs.attributes import wide_to_long
from spark_jobs.pandas_frames import object_strings
from spark_jobs.parquet_types import check_same_types, data_files
from spark_jobs.synthetic import SyntheticParams, synthetic_source
from spark_jobs.validate import SchemaError, check_columns, one_event_type

ML_GENRES = (
    "unknown",
    "Action",
    "Adventure",
    "Animation",
    "Children's",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
)
# MovieLens 1M's age groups, applied to 100K's exact ages.
AGE_BUCKETS = (
    (18, "under 18"),
    (25, "18-24"),
    (35, "25-34"),
    (45, "35-44"),
    (50, "45-49"),
    (56, "50-55"),
    (200, "56+"),
)


@dataclass
class Source:
    events: DataFrame
    client_attrs: DataFrame | None = None
    item_attrs: DataFrame | None = None


def age_bucket(age: int) -> str:
    return next(label for limit, label in AGE_BUCKETS if age < limit)


def movielens(spark, folder: str) -> Source:
    """MovieLens 100K: u.data ratings; u.user (age bucket, gender, occupation); u.item genres.

    u.user has no dates, so its attributes are known from the start (null timestamp). The item
    category is the first genre flagged in u.item ("unknown" when none is); genres lists them all;
    year is the release date's year.
    """
    root = Path(folder)
    if not (root / "u.data").exists():
        raise FileNotFoundError(f"MovieLens 100K: no u.data in {root}")
    events = (
        spark.read.csv(
            str((root / "u.data").resolve()),
            sep="\t",
            schema="client_id string, item_id string, value string, timestamp string",
        )
        .withColumn("event_type", F.lit("rating"))
        .select("client_id", "item_id", "timestamp", "event_type", "value")
    )
    users = pd.read_csv(
        root / "u.user",
        sep="|",
        header=None,
        dtype=str,
        names=["client_id", "age", "gender", "occupation", "zip"],
    )
    users["age_bucket"] = users["age"].astype(int).map(age_bucket)
    long = users.melt(
        id_vars="client_id",
        value_vars=["age_bucket", "gender", "occupation"],
        var_name="name",
        value_name="value",
    )
    client_attrs = spark.createDataFrame(
        object_strings(long.assign(timestamp=None)[["client_id", "timestamp", "name", "value"]]),
        "client_id string, timestamp long, name string, value string",
    )
    items = pd.read_csv(
        root / "u.item",
        sep="|",
        header=None,
        dtype=str,
        encoding="latin-1",
        names=["item_id", "title", "release", "video", "url", *ML_GENRES],
    )
    flags = items[list(ML_GENRES)].astype(int).to_numpy().astype(bool)
    genres = [
        "|".join(g for g, on in zip(ML_GENRES, row, strict=True) if on) or "unknown"
        for row in flags
    ]
    released = pd.to_datetime(items["release"], format="%d-%b-%Y", errors="coerce").dt.year
    item_attrs = spark.createDataFrame(
        object_strings(pd.DataFrame(
            {
                "item_id": items["item_id"],
                "category": [g.split("|")[0] for g in genres],
                "genres": genres,
                "year": [None if pd.isna(y) else int(y) for y in released],
            }
        )),
        "item_id string, category string, genres string, year int",
    )
    return Source(events, client_attrs, item_attrs)


class SourceError(ValueError):
    """The source cannot be read here; the message names it and the fix (exit 2)."""


def read_table(spark, path: str) -> DataFrame:
    """Parquet (file or folder) as typed; CSV with a header, every column read as a string.
    `path` is a local path or a URL Spark's Hadoop filesystems read (file://, hdfs://, ...).

    CSV is read as RFC 4180 records: a quoted field may hold separators and line breaks, and
    a doubled quote inside one is a quote (Spark's defaults split such records into several
    rows and keep backslash escapes instead)."""
    files = []  # the local CSV files (at a URL they are not read here: as Spark reads them)
    sep = csv_files.separator(Path(path).name)  # of a file named .csv or .tsv (or compressed)
    if storage.is_remote(path):
        location, csv_inside = path, _remote_csv_inside(spark, path)
        if csv_inside:
            csv_files.check_headers_alike(path, _remote_csv_headers(spark, path))
    else:
        p = storage.local_path(path)
        if not p.exists():
            raise SourceError(f"no such file or folder: {path}; check the path")
        location = str(p.resolve())
        csv_inside = p.is_dir() and any(csv_files.is_csv(f.name) for f in p.iterdir())
        if csv_inside:
            csv_files.check_same_headers(p)
        files = csv_files.csv_files(p) if p.is_dir() else [p]
        if p.is_dir() and not csv_inside and not data_files(p):  # Spark: "unable to infer"
            raise SourceError(f"no CSV (*.csv) or Parquet files in {path}; check the path")
        if p.is_file() and not sep:  # Spark's own refusal is a page of Java
            check_parquet_file(p)
    if sep or csv_inside:
        only_csv = {"pathGlobFilter": csv_files.PATTERN} if csv_inside else {}
        return spark.read.csv(
            location,
            header=True,
            inferSchema=False,
            sep=sep or ",",
            multiLine=True,
            quote='"',
            escape='"',
            **only_csv,
            **csv_files.line_options(files),
        )
    if not storage.is_remote(path):  # one line here, not Spark's trace mid-job
        check_same_types(Path(location), "Parquet input")
    return spark.read.parquet(location)


def check_parquet_file(path: Path) -> None:
    """SourceError naming a file the job would read as Parquet that is not one, and the names
    it reads as CSV."""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - 4))
        if f.read(4) == b"PAR1":
            return
    raise SourceError(f"{path} is not a Parquet file, and the job reads a file as CSV by its "
                      "name: .csv, or .tsv for tabs (also .gz or .bz2 compressed); rename it")


def _remote_csv_inside(spark, url: str) -> bool:
    """Whether the folder at `url` holds CSV files, asked of the Hadoop filesystem Spark itself
    reads `url` with; SourceError when Spark has none for its scheme, cannot reach it, or
    finds nothing there."""
    jvm, fs, path = _hadoop_filesystem(spark, url)
    try:
        if not fs.exists(path):
            raise SourceError(f"no such file or folder: {url}; check the URL")
        return fs.isDirectory(path) and len(fs.globStatus(jvm.org.apache.hadoop.fs.Path(
            url.rstrip("/") + "/" + csv_files.PATTERN))) > 0
    except Py4JJavaError as exc:
        raise _hadoop_error(url, exc) from None


def _remote_csv_headers(spark, url: str) -> list[tuple[str, list[str]]]:
    """(name under `url`, header) of each CSV file in the folder at `url`, sorted by name, read
    through the Hadoop filesystem Spark reads it with: the first csv_files.HEADER_BYTES. As
    for a local folder (csv_files.check_same_headers): Spark takes every file's columns from
    the first one's header, and a file with its columns in another order had its ids swapped."""
    jvm, fs, root = _hadoop_filesystem(spark, url)
    try:
        names, found = [], fs.listFiles(root, True)
        while found.hasNext():
            path = found.next().getPath()
            if csv_files.is_csv(path.getName()):
                names.append(path.toString())
        headers = []
        prefix = fs.makeQualified(root).toString().rstrip("/") + "/"
        commons_io = jvm.org.apache.commons.io  # Spark's own jars hold it (Java 8 too)
        for name in sorted(names):
            stream = fs.open(jvm.org.apache.hadoop.fs.Path(name))
            try:
                start = bytes(commons_io.IOUtils.toByteArray(
                    commons_io.input.BoundedInputStream(stream, csv_files.HEADER_BYTES)))
            finally:
                stream.close()
            start = csv_files.decompressed_start(name, start)
            headers.append((name.removeprefix(prefix), csv_files.header_of(io.BytesIO(start))))
        return headers
    except Py4JJavaError as exc:
        raise _hadoop_error(url, exc) from None


def _hadoop_filesystem(spark, url: str):
    """(the JVM, the Hadoop filesystem Spark reads `url` with, `url` as its Path)."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(url)
    try:
        return jvm, path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path
    except Py4JJavaError as exc:
        raise _hadoop_error(url, exc) from None


def _hadoop_error(url: str, exc: Py4JJavaError) -> SourceError:
    text = " ".join(str(exc.java_exception).split())[:300]
    scheme = storage.scheme(url)
    if "No FileSystem for scheme" in text or "ClassNotFoundException" in text:
        return SourceError(
            f"Spark has no filesystem for {scheme}:// here ({url}): s3a:// needs the hadoop-aws "
            "jars on the cluster (Databricks and EMR have them; s3:// is s3a:// outside them), "
            "abfss:// hadoop-azure; or copy the data to a local path or a table (table:NAME)")
    return SourceError(f"Spark cannot reach {url}: {text}; check the URL and the credentials")


def catalog_table(spark, name: str) -> DataFrame:
    """Any table the session's catalog knows (Hive/managed tables; Delta and Unity Catalog
    tables on Databricks), by name: `table`, `db.table` or `catalog.db.table`."""
    try:
        return spark.table(name)
    except AnalysisException as exc:
        raise SourceError(f"no table {name!r} in the Spark session's catalog "
                          f"({' '.join(str(exc).split())[:160]}): check the name "
                          "(database.table), or read the files with events:PATH") from None


DELTA_MISSING = ("delta: needs the Delta Lake jars in the Spark session, and this session has "
                 "none: on Databricks Delta is built in; elsewhere start Spark with the Delta "
                 "jars (delta-spark), or register the table in the catalog and use table:NAME")


def delta_table(spark, path: str) -> DataFrame:
    """The current version of the Delta table at `path` (its _delta_log read by Delta Lake,
    never the raw Parquet files, which hold deleted and replaced rows too)."""
    try:
        return spark.read.format("delta").load(path)
    except AnalysisException as exc:
        text = str(exc)
        if "DATA_SOURCE_NOT_FOUND" in text or "Failed to find data source" in text:
            raise SourceError(DELTA_MISSING) from None
        raise SourceError(f"cannot read the Delta table at {path}: "
                          f"{' '.join(text.split())[:200]}") from None
    except Py4JJavaError as exc:
        if "ClassNotFoundException" in str(exc.java_exception) and "delta" in str(exc):
            raise SourceError(DELTA_MISSING) from None
        raise _hadoop_error(path, exc) from None


def event_rows(spark, kind: str, spec: str) -> DataFrame:
    """The raw event rows of an events:, table: or delta: source."""
    if kind == "table":
        return catalog_table(spark, spec)
    if kind == "delta":
        return delta_table(spark, spec)
    return read_table(spark, spec)


def client_attrs_table(spark, path: str) -> DataFrame:
    """client_id, timestamp and one column per attribute (null = unchanged) -> long form."""
    df = read_table(spark, path)
    for column in ("client_id", "timestamp"):
        if column not in df.columns:
            raise SchemaError(f"client attributes: missing column {column!r} (has: {df.columns})")
    names = [c for c in df.columns if c not in ("client_id", "timestamp")]
    if not names:
        raise SchemaError("client attributes: no attribute columns besides client_id, timestamp")
    ts = F.col("timestamp")
    if dict(df.dtypes)["timestamp"] == "string":  # unix seconds or ISO dates
        text = F.trim(ts)
        ts = F.coalesce(text.cast("double").cast("long"), F.to_timestamp(text).cast("long"))
        check_attr_times(df.withColumn("parsed", ts), F.length(text) > 0)
    return wide_to_long(df.withColumn("timestamp", ts.cast("long")), names)


def check_attr_times(df: DataFrame, given: Column) -> None:
    """A timestamp that is there but unreadable would read as null, "known from the start": the
    attribute would be history for events before it (future information). Refused instead."""
    bad = df.filter(given & F.col("parsed").isNull())
    count = bad.count()
    if count:
        first = bad.select("client_id", "timestamp").first()
        raise SchemaError(
            f"client attributes: {count:,} row{'s' * (count != 1)} with a timestamp that is "
            f"neither unix seconds nor an ISO date, e.g. {first['timestamp']!r} for client "
            f"{first['client_id']!r}: fix or remove them (an empty timestamp means known from "
            "the start)")


def check_unique_items(df: DataFrame) -> None:
    """One row an item: with two, which category won would be up to Spark's order."""
    repeated = df.groupBy("item_id").count().filter("count > 1")
    count = repeated.count()
    if count:
        first = repeated.first()
        raise SchemaError(
            f"item attributes: {count:,} item_id{'s' * (count != 1)} on more than one row, e.g. "
            f"{first['item_id']!r} on {first['count']}: keep one row an item")


def item_attrs_table(spark, path: str) -> DataFrame:
    df = read_table(spark, path)
    for column in ("item_id", "category"):
        if column not in df.columns:
            raise SchemaError(f"item attributes: missing column {column!r} (has: {df.columns})")
    check_unique_items(df.withColumn("item_id", F.col("item_id").cast("string")))
    genres = (
        F.col("genres").cast("string") if "genres" in df.columns else F.lit(None).cast("string")
    )
    year = F.col("year").cast("int") if "year" in df.columns else F.lit(None).cast("int")
    return df.select(
        F.col("item_id").cast("string").alias("item_id"),
        F.col("category").cast("string").alias("category"),
        genres.alias("genres"),
        year.alias("year"),
    )


def load_source(spark, config) -> Source:
    kind, spec = config.source_kind, config.source_spec
    if kind == "movielens":
        return movielens(spark, spec)
    if kind == "synthetic":
        events, client_attrs, item_attrs = synthetic_source(spark, SyntheticParams.parse(spec))
        return Source(events, client_attrs, item_attrs)
    events = one_event_type(event_rows(spark, kind, spec), config.event_type)
    check_columns(events)
    return Source(
        events,
        client_attrs_table(spark, config.client_attrs) if config.client_attrs else None,
        item_attrs_table(spark, config.item_attrs) if config.item_attrs else None,
    )
