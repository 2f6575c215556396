"""The CSV files of an events folder, checked before Spark reads them.

Spark reads a folder of CSV files by position: the first file's header names the columns of
every file, and each other header is skipped unread. A file whose columns stand in another order
(`item_id,client_id,...`) would have its ids swapped without a word, so every header is compared
first (the first record of each file only, read as RFC 4180 as the job reads it).
"""

from __future__ import annotations

import csv
from pathlib import Path

from spark_jobs.validate import SchemaError

PATTERN = "*.csv"  # only these are read from a folder: a README beside them is not input


def header(path: Path) -> list[str]:
    with path.open(newline="", encoding="utf-8-sig", errors="replace") as f:  # BOM or not
        return next(csv.reader(f), [])


def check_same_headers(folder: Path) -> None:
    """SchemaError naming two files whose headers differ (their columns or their order)."""
    files = sorted(p for p in folder.rglob(PATTERN) if p.is_file())
    if not files:
        return
    first = header(files[0])
    for path in files[1:]:
        other = header(path)
        if other != first:
            raise SchemaError(
                f"CSV files with different headers in {folder}: {files[0].name} has "
                f"{','.join(first)}, {path.relative_to(folder)} has {','.join(other)}; Spark "
                "reads every file by the first one's column order: give every file the same "
                "header, or read them as separate inputs")
