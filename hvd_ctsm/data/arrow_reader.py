"""A split's rows read with pyarrow alone: the rows, in the order, that Petastorm's
`make_reader(..., reader_pool_type="dummy")` gives the trainer, without Petastorm.

Petastorm 0.13 reads through pyarrow's legacy ParquetDataset, which pyarrow 15 removed, so on
current stacks (pyarrow >= 15, numpy 2, often no Spark in the training process) it cannot read at
all. There this reader takes over (`hvd_ctsm.data.batches.open_reader` chooses). It follows
Petastorm's
rules one by one, so a run reads the same batches under either reader (a test compares them row
by row, shuffled and sharded):

- row groups are numbered file by file, the files sorted by path, each file's in order;
- with a seed, those numbers are shuffled by Python's `random.Random(seed)` (Petastorm's shard
  shuffle), and rank r of n keeps the numbers i with i % n == r, in that order;
- with `shuffle`, that list is permuted by numpy's `default_rng(seed)` (Petastorm's ventilator);
- each row group's rows come in file order; scalars are cast to the schema's numpy type, arrays
  decoded from their `np.save` bytes (`hvd_ctsm.data.npy_codec.decode_npy`).
"""

from __future__ import annotations

import logging
import random
from collections import namedtuple
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

import numpy as np

from hvd_ctsm.data.dataset_meta import REBUILD, DatasetError
from hvd_ctsm.data.npy_codec import decode_npy
from hvd_ctsm.data.pinned import check_split, failure_said_as_replaced, open_checked
from hvd_ctsm.data.schema import FIELDS, SCALAR_TYPES

COLUMNS = [name for name, *_ in FIELDS]  # every column, in stored order


@dataclass(frozen=True)
class RowGroup:
    path: str  # the file, local or inside `filesystem`'s namespace
    index: int  # its row group
    rows: int


def _location(url: str):
    """(fsspec filesystem or None for local files, path) of a split URL."""
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        return None, unquote(parsed.path) if parsed.scheme else url
    from hvd_ctsm.files import storage
    return storage.filesystem(url)


def _open(fs, path):
    """A split's file, opened to read; a local one only while its dataset is still the build
    the step opened (hvd_ctsm.data.pinned)."""
    return open_checked(path) if fs is None else fs.open(path, "rb")


def _parquet_files(fs, folder: str) -> list[str]:
    """The split's data files sorted by path, as Petastorm orders them (names starting with '_' or
    '.' are Spark's and Petastorm's bookkeeping, not data)."""
    from pathlib import Path

    if fs is None:
        with failure_said_as_replaced(lambda: check_split(folder), FileNotFoundError):
            names = [str(p) for p in Path(folder).iterdir() if p.is_file()]
    else:
        names = [e["name"] for e in fs.ls(folder, detail=True) if e["type"] == "file"]
    return sorted(n for n in names if n.endswith(".parquet")
                  and not Path(n).name.startswith(("_", ".")))


def row_groups(url: str) -> tuple[RowGroup, ...]:
    """Every row group of the split, in Petastorm's numbering (footers only)."""
    import pyarrow.parquet as pq

    fs, folder = _location(url)
    groups = []
    for path in _parquet_files(fs, folder):
        with _open(fs, path) as f:
            meta = pq.ParquetFile(f).metadata
        groups += [RowGroup(path, i, meta.row_group(i).num_rows)
                   for i in range(meta.num_row_groups)]
    return tuple(groups)


def shard_order(count: int, rank: int, size: int, seed: int | None, shuffle: bool) -> list[int]:
    """The row group numbers rank `rank` of `size` reads, in the order it reads them."""
    numbers = list(range(count))
    if seed is not None:
        random.Random(seed).shuffle(numbers)
    numbers = [i for i in numbers if i % size == rank]
    if shuffle:
        rng = np.random.default_rng(seed if seed else None)
        numbers = [numbers[i] for i in rng.permutation(len(numbers))]
    return numbers


def _decoder(name: str):
    scalar = SCALAR_TYPES.get(name)
    return decode_npy if scalar is None else scalar


def row_decoder(fields: list[str]):
    """A function from {column: stored value} to the decoded row, for rows Spark read."""
    row_type = namedtuple("Row", fields)
    decoders = [_decoder(name) for name in fields]

    def decode(record) -> tuple:
        return row_type(*(decode(record[name])
                          for name, decode in zip(fields, decoders, strict=True)))

    return decode


def spark_rows(spark, url: str, fields: list[str] | None = None):
    """The split at `url` as an RDD of decoded rows (all columns, or only `fields`), read by
    Spark's executors: what batch scoring and the TorchEstimator route start from."""
    fields = list(fields or COLUMNS)

    def decoded(records):
        decode = row_decoder(fields)
        return (decode(record.asDict()) for record in records)

    return spark.read.parquet(url).select(*fields).rdd.mapPartitions(decoded)


def read_row_group(url: str, group: RowGroup, fields: list[str] | None = None) -> list:
    """One row group's rows, decoded (all columns, or only `fields`)."""
    fields = list(fields or COLUMNS)
    table = _read_table(url, group, fields)
    row_type = namedtuple("Row", fields)
    columns = [[decode(v) for v in table.column(name).to_pylist()]  # column by column: faster
               for name, decode in zip(fields, map(_decoder, fields), strict=True)]
    return [row_type(*values) for values in zip(*columns, strict=True)]


class DamagedFileError(DatasetError):
    """A row group pyarrow cannot decode (damaged_said): not another DatasetError raised while
    reading, such as a dataset replaced by a new build."""


def _read_table(url: str, group: RowGroup, fields: list[str]):
    """One row group's columns as pyarrow reads them; a damaged page is its file's line."""
    import pyarrow.parquet as pq

    fs, _ = _location(url)
    with _open(fs, group.path) as f, damaged_said(f"{group.path}: row group {group.index}"):
        return pq.ParquetFile(f).read_row_group(group.index, columns=fields)


def damaged_group_said(url: str, rank: int, size: int, seed: int | None,
                       fields: list[str] | None = None) -> DamagedFileError | None:
    """The line of the first row group of rank `rank`'s shard that cannot be read (its file and
    number), found by reading the shard again; None when every one reads. For a reader that
    does not say which file failed (Petastorm's), on its failure only."""
    groups = row_groups(url)
    shard = shard_order(len(groups), rank, size, seed, shuffle=False)
    logging.getLogger("hvd_ctsm.data").warning(
        "rank %d: a row group of %s cannot be read: reading the shard's %d row groups again to "
        "name its file", rank, _location(url)[1], len(shard))
    for number in shard:
        try:
            _read_table(url, groups[number], list(fields or COLUMNS))
        except DamagedFileError as exc:
            return exc
    return None


@contextmanager
def damaged_said(where: str, damaged: str = "the file is damaged"):
    """A row group that pyarrow cannot decode is a damaged file of the dataset: its one line
    (DatasetError, exit 2), not a crash's traceback. Its footer was read when the split was
    planned and its size matched the dataset's listing, so only its pages are damaged; a
    system's I/O error (it has an errno) stays what it is."""
    import pyarrow as pa

    try:
        yield
    except (OSError, pa.ArrowException) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise DamagedFileError(f"{where} cannot be read ({first}): {damaged}; {REBUILD}") \
            from exc


def rows_said_damaged(rows: Iterator, where: str, damaged: str,
                      find_damaged=lambda: None) -> Iterator:
    """`rows`, where a reader that decodes row groups inside next() (Petastorm's) fails on a
    damaged one as damaged_said says, or as `find_damaged()` says naming the file (None: it
    found none). The yield stays outside the `with`: an error the consumer throws into this
    generator is not the file's."""
    rows = iter(rows)
    while True:
        try:
            with damaged_said(where, damaged):
                try:
                    row = next(rows)
                except StopIteration:
                    return
        except DamagedFileError as exc:
            named = find_damaged()
            if named is None:
                raise
            raise named from exc
        yield row


@contextmanager
def open_arrow_reader(url: str, rank: int, size: int, seed: int | None, shuffle: bool,
                      fields: list[str] | None = None):
    """Rank `rank`'s shard of the split at `url` (all columns, or only `fields`), row group by
    row group in the calling thread: the same signature and rows as data.open_reader."""
    groups = row_groups(url)
    order = shard_order(len(groups), rank, size, seed, shuffle)
    yield (row for i in order for row in read_row_group(url, groups[i], fields))
