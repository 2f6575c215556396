"""The CSV files of an events folder, checked before Spark reads them.

Spark reads a folder of CSV files by position: the first file's header names the columns of
every file, and each other header is skipped unread. A file whose columns stand in another order
(`item_id,client_id,...`) would have its ids swapped without a word, so every header is compared
first (the first record of each file only, read as RFC 4180 as the job reads it); in a folder at
a URL too, from each file's first 64 KiB (spark_jobs.sources). The line endings below are
checked in local files only: at a URL that would read every file twice.

Line endings: Spark's multi-line CSV reader ends every record of a file with the line ending of
its first line. In a file that mixes CRLF and LF records (files joined together, an editor that
saved part of one) a CRLF after LF ones left its CR at the end of the last column (item 'x\r'
beside 'x', an ISO timestamp rejected), and an LF after CRLF ones joined two records into one
(the second one's fields dropped), without a word. Such a file is read with LF as the line
ending and the CR before it dropped, and so is every file of its folder (one read takes one line
ending: `line_options`); a folder where another file ends its lines with CR alone is refused.
A folder without such a file is read as before.

Compressed files (`.csv.gz`, `.csv.bz2`, and `.tsv.gz`, `.tsv.bz2` named alone) are read as
Spark reads them, through its Hadoop codecs; the checks above read them decompressed.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from spark_jobs.validate import SchemaError

# Only these are read from a folder (a README beside them is not input); PATTERN in Hadoop's
# glob syntax, as Spark's pathGlobFilter and a filesystem's globStatus take it.
CSV_NAMES = (".csv", ".csv.gz", ".csv.bz2")
PATTERN = "*.{csv,csv.gz,csv.bz2}"
COMPRESSED = {".gz": gzip.open, ".bz2": bz2.open}  # the codecs Spark reads by the file's name
DECOMPRESSORS = {".gz": lambda: zlib.decompressobj(wbits=zlib.MAX_WBITS | 16),  # gzip's header
                 ".bz2": bz2.BZ2Decompressor}  # of the same codecs, for a file's first bytes


def is_csv(name: str) -> bool:
    """Whether a folder's file of this name is one of its CSV files."""
    return name.lower().endswith(CSV_NAMES)


def separator(name: str) -> str | None:
    """The separator of a file named so: ',' for .csv, a tab for .tsv (each also compressed);
    None for any other name (Parquet, for the job)."""
    stem = name.lower()
    for suffix in COMPRESSED:
        stem = stem.removesuffix(suffix)
    return {".csv": ",", ".tsv": "\t"}.get(Path(stem).suffix)


def open_bytes(path: Path) -> BinaryIO:
    """`path` for reading its bytes, decompressed where its name says it is compressed."""
    return COMPRESSED.get(path.suffix.lower(), open)(path, "rb")


def decompressed_start(name: str, start: bytes) -> bytes:
    """The decompressed bytes of a file's first bytes `start` (a file at a URL's first
    HEADER_BYTES): as much as they hold."""
    decompressor = DECOMPRESSORS.get(Path(name).suffix.lower())
    if decompressor is None:
        return start
    try:
        return decompressor().decompress(start)
    except (zlib.error, OSError, EOFError):
        return b""  # not what its name says: no header, so unlike the first file's


HEADER_BYTES = 1 << 16  # read of each CSV file at a URL, to take its header from


def header(path: Path) -> list[str]:
    with open_bytes(path) as f, unreadable_said(path):
        return header_of(f)


@contextmanager
def unreadable_said(path: Path):
    """A compressed file that cannot be decompressed (cut short, or not what its name says):
    SchemaError naming it, not a traceback."""
    try:
        yield
    except (OSError, EOFError, zlib.error) as exc:
        if path.suffix.lower() not in COMPRESSED:
            raise
        raise SchemaError(f"{path} cannot be decompressed ({exc}): check the file, or its "
                          "name's suffix") from None


def header_of(data: BinaryIO) -> list[str]:
    """The first record of a file's bytes (a local file, or a file at a URL's first
    HEADER_BYTES), read as RFC 4180 as the job reads it."""
    text = io.TextIOWrapper(data, encoding="utf-8-sig", errors="replace", newline="")  # BOM or not
    return next(csv.reader(text), [])


CRLF, LF, CR = b"\r\n", b"\n", b"\r"
CHUNK = 1 << 20


def csv_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and is_csv(p.name))


def line_endings(path: Path) -> set[bytes]:
    """The line endings (CRLF, LF, CR) in `path`, quoted ones too, read until both CRLF and LF
    are seen, else to the end. Bytes counted at C speed: most files have one ending, and only
    a file holding both is read again to tell its records' endings from line breaks quoted
    inside fields (record_endings: 20 MB/s where every line is split at its quotes)."""
    found: set[bytes] = set()
    for chunk in _chunks(path):
        found |= _endings(chunk)
        if {CRLF, LF} <= found:
            break
    return found


def _chunks(path: Path):
    """`path`'s bytes in chunks of CHUNK, a CRLF never split between two."""
    with open_bytes(path) as f, unreadable_said(path):
        while chunk := f.read(CHUNK):
            yield chunk + f.read(1) if chunk.endswith(CR) else chunk


def record_endings(path: Path) -> set[bytes]:
    """The line endings (CRLF, LF, CR) that end records of `path`: those outside quoted fields,
    where a line break is data (an Excel cell's LF in a CRLF file). Read until both CRLF and LF
    are seen, else to the end."""
    found: set[bytes] = set()
    inside = False  # within a quoted field; a doubled quote toggles twice
    for chunk in _chunks(path):
        for n, part in enumerate(chunk.split(b'"')):
            inside = inside != (n > 0)
            if not inside:
                found |= _endings(part)
        if {CRLF, LF} <= found:
            break
    return found


def _endings(text: bytes) -> set[bytes]:
    crlf = text.count(CRLF)
    counts = {CRLF: crlf, LF: text.count(LF) - crlf, CR: text.count(CR) - crlf}
    return {ending for ending, count in counts.items() if count}


def line_options(files: list[Path]) -> dict:
    """spark.read.csv options for reading `files`: none (Spark's own line ending per file, as
    always) unless a file mixes CRLF and LF records; then LF ends a line of every file (one
    read takes one line ending) and the CR before it goes with the trailing white space Spark
    drops from an unquoted field (a trailing space or tab of an unquoted field goes too: ids
    are trimmed of spaces anyway). A file beside it whose lines end with CR alone would be one
    record then: refused."""
    endings = {path: line_endings(path) for path in files}
    mixing = [path for path, found in endings.items()
              if {CRLF, LF} <= found and {CRLF, LF} <= record_endings(path)]
    if not mixing:
        return {}
    cr_alone = [path for path, found in endings.items()
                if CR in found and record_endings(path) == {CR}]
    if cr_alone:
        raise SchemaError(
            f"{mixing[0]} ends its lines with CRLF and LF both, and {cr_alone[0]} with CR alone: "
            "Spark reads a folder's files with one line ending; convert the lines of "
            f"{cr_alone[0].name} to end with LF (e.g. tr '\\r' '\\n'), or read it apart")
    return {"lineSep": "\n", "ignoreTrailingWhiteSpace": True}


def check_same_headers(folder: Path) -> None:
    """SchemaError naming two files whose headers differ (their columns or their order)."""
    check_headers_alike(folder, [(str(path.relative_to(folder)), header(path))
                                 for path in csv_files(folder)])


def check_headers_alike(folder, headers: list[tuple[str, list[str]]]) -> None:
    """SchemaError naming the first file and another whose headers differ; `headers`: (file's
    name in `folder`, its header), in the order Spark lists the files."""
    if not headers:
        return
    (first_name, first), others = headers[0], headers[1:]
    for name, other in others:
        if other != first:
            raise SchemaError(
                f"CSV files with different headers in {folder}: {first_name} has "
                f"{','.join(first)}, {name} has {','.join(other)}; Spark "
                "reads every file by the first one's column order: give every file the same "
                "header, or read them as separate inputs")
