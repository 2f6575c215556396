"""Refuse a Parquet input whose files disagree on a column's type, before Spark reads it.

Spark takes one file's schema for the whole folder and fails mid-job, with a Java trace of about
160 lines, on the first file of another type ("Parquet column cannot be converted"). Spark 3.5
widens nothing here: int32 next to int64, float next to double, int next to string all fail
(measured), so any difference in the type Spark sees is refused. Reading the footers costs one
small read per file on the driver.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spark_jobs.validate import SchemaError


class MixedParquetTypesError(SchemaError):
    """Files of one Parquet input hold the same column with different types."""


def data_files(folder: Path) -> list[Path]:
    """The files Spark reads from `folder`: every file below it whose name and folders do not
    start with '_' or '.' (Spark's rule for hidden and metadata files)."""
    files = []
    for path in sorted(folder.rglob("*")):
        parts = path.relative_to(folder).parts
        if path.is_file() and not any(p.startswith(("_", ".")) for p in parts):
            files.append(path)
    return files


def spark_view(dtype: pa.DataType) -> str:
    """The type as Spark reads it: encodings that Spark reads as one type count as one
    (dictionary-encoded and large strings are strings; timestamp units are all read)."""
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    if pa.types.is_large_string(dtype):
        return str(pa.string())
    if pa.types.is_large_binary(dtype):
        return str(pa.binary())
    if pa.types.is_timestamp(dtype):
        return "timestamp"
    return str(dtype)


def check_same_types(folder: Path, what: str = "input") -> None:
    """Raise MixedParquetTypesError naming the first column whose type differs between files,
    one file of each type and the fix."""
    if not folder.is_dir():
        return  # one file has one schema
    seen: dict[str, dict[str, Path]] = defaultdict(dict)  # column -> type -> first file
    for file in data_files(folder):
        try:
            schema = pq.read_schema(file)
        except (pa.ArrowInvalid, OSError) as exc:
            raise SchemaError(f"{what} {folder}: {file.relative_to(folder)} is not a readable "
                              f"Parquet file ({exc}); move it out of the folder") from exc
        for field in schema:
            seen[field.name].setdefault(spark_view(field.type), file)
    for column, types in seen.items():
        if len(types) > 1:
            examples = ", ".join(f"{name} in {file.relative_to(folder)}"
                                 for name, file in types.items())
            raise MixedParquetTypesError(
                f"{what} {folder}: column {column!r} has different types in different files "
                f"({examples}); Spark reads one type per column: rewrite the files with one "
                f"type for {column!r} (e.g. cast it to string everywhere) or move the odd "
                "files to their own input")
