"""Dataset and score locations: a local path, or a URL on any fsspec filesystem (s3://, hdfs://,
gs://, abfss://, file://, ...).

Local paths (and file:// URLs) keep the plain file-system route the rest of the package uses
(atomic renames, markers). Remote URLs go through fsspec, the library Petastorm itself resolves
dataset URLs with, so the trainer's reader, the checks before it and the scorer agree on how a
URL is reached: s3:// needs s3fs (credentials and endpoint from the usual AWS settings, e.g.
AWS_ENDPOINT_URL for an S3-compatible server), hdfs:// needs the Hadoop client (libhdfs).
Every failure to reach a URL is a StorageError: one line naming the URL and the fix.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*):/")


class StorageError(ValueError):
    """A location cannot be reached or used; the message names it and the fix."""


def scheme(location: str | Path) -> str:
    """The URL scheme of `location` in lower case ('' for a plain path)."""
    found = _SCHEME.match(str(location))
    return found.group(1).lower() if found else ""


def is_remote(location: str | Path) -> bool:
    """True for a URL that is not file://: it is reached through fsspec, not the local disk."""
    return scheme(location) not in ("", "file")


def local_path(location: str | Path) -> Path:
    """The local path of a plain path or a file:// URL."""
    text = str(location)
    if scheme(text) == "file":
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(text).path))
    return Path(text)


def location(text: str) -> str:
    """A location as a user may write it, as the package takes it: Databricks' `dbfs:/Volumes/...`
    (a Unity Catalog volume) and other `dbfs:/...` paths become the local paths every node of a
    Databricks cluster mounts them at (`/Volumes/...`, `/dbfs/...`), so that they take the local
    route (atomic renames, markers) as `/Volumes/...` itself does; anything else is unchanged.
    The type of every command-line option that names a dataset, model, report or output."""
    if scheme(text) != "dbfs":
        return text
    path = "/" + re.sub(r"^dbfs:/+", "", text, flags=re.IGNORECASE)
    return path if path.startswith("/Volumes/") or path == "/Volumes" else "/dbfs" + path


def check_local(location: str | Path, option: str, also: str = "") -> None:
    """Refuse a URL for an option that takes local paths only (the registry, run folders,
    reports, models): a plain path's route would have made a folder named `s3:` here and written
    into it, saying it wrote to the URL. `also` names a URI form the option takes besides (the
    caller lets it through first), e.g. models:/NAME@ALIAS."""
    if is_remote(location):
        besides = f" or {also}" if also else ""
        raise StorageError(f"{option} takes a local path (or a mounted one such as /dbfs/... or "
                           f"/Volumes/...){besides}, not the URL {location}: pass one (copy the "
                           "files between it and the URL yourself)")


def join(location: str | Path, *parts: str) -> str:
    """`location`/part/... as a string (URL joining keeps the scheme and host)."""
    if is_remote(location):
        return "/".join([str(location).rstrip("/"), *parts])
    return str(local_path(location).joinpath(*parts))


def _why(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def filesystem(url: str):
    """(fsspec filesystem, path inside it) for a remote URL; StorageError when no filesystem
    serves its scheme or the library for it is missing."""
    import fsspec

    name = scheme(url)
    try:
        fs_class = fsspec.get_filesystem_class(name)
    except ValueError as exc:
        raise StorageError(f"no filesystem for {name}:// URLs ({url}): use a local path, file://, "
                           "s3://, hdfs:// or another scheme fsspec knows") from exc
    except ImportError as exc:
        raise StorageError(f"{name}:// URLs need a library that is not installed ({_why(exc)}): "
                           f"install it (s3://: pip install s3fs) to reach {url}") from exc
    try:
        fs = fs_class(**fsspec.config.conf.get(name, {}))
    except Exception as exc:  # noqa: BLE001  e.g. no Hadoop client for hdfs://
        raise StorageError(f"cannot open the filesystem of {url}: {_why(exc)}") from exc
    return fs, fs_class._strip_protocol(url)


def _unreachable(url: str, exc: BaseException) -> StorageError:
    return StorageError(f"cannot reach {url}: {_why(exc)}; check the URL, the endpoint (e.g. "
                        "AWS_ENDPOINT_URL) and the credentials")


def _call(url: str, action):
    """Run action(fs, path) on `url`'s filesystem; errors other than a missing file become one
    StorageError line."""
    fs, path = filesystem(url)
    try:
        return action(fs, path)
    except FileNotFoundError:
        raise
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001  connection refused, DNS, credentials, ...
        raise _unreachable(url, exc) from exc


def exists(location: str | Path) -> bool:
    if not is_remote(location):
        return local_path(location).exists()
    return _call(str(location), lambda fs, path: fs.exists(path))


def is_dir(location: str | Path) -> bool:
    if not is_remote(location):
        return local_path(location).is_dir()
    return _call(str(location), lambda fs, path: fs.isdir(path))


def read_bytes(location: str | Path) -> bytes:
    """The whole file; FileNotFoundError (with the location as filename) when it is absent."""
    if not is_remote(location):
        return local_path(location).read_bytes()

    def cat(fs, path):
        if not fs.isfile(path):
            raise FileNotFoundError(2, "not found", str(location))
        return fs.cat_file(path)

    return _call(str(location), cat)


def parquet_sizes(folder: str | Path) -> dict[str, int]:
    """{file name: bytes} of the *.parquet files directly in `folder`."""
    if not is_remote(folder):
        return {f.name: f.stat().st_size for f in local_path(folder).glob("*.parquet")}

    def listing(fs, path):
        if not fs.isdir(path):
            return {}
        return {Path(e["name"]).name: int(e["size"]) for e in fs.ls(path, detail=True)
                if e["type"] == "file" and e["name"].endswith(".parquet")}

    return _call(str(folder), listing)


def parquet_rows(location: str | Path) -> int:
    """Rows of one Parquet file, from its footer."""
    import pyarrow.parquet as pq

    if not is_remote(location):
        return pq.ParquetFile(local_path(location)).metadata.num_rows

    def footer(fs, path):
        with fs.open(path, "rb") as f:
            return pq.ParquetFile(f).metadata.num_rows

    return _call(str(location), footer)


def parquet_columns(location: str | Path) -> tuple[str, ...]:
    """Column names of a Parquet file ((), when it is not Parquet)."""
    import pyarrow.parquet as pq

    def schema(fs, path):
        with fs.open(path, "rb") as f:
            return tuple(pq.read_schema(f).names)

    try:
        if not is_remote(location):
            return tuple(pq.read_schema(local_path(location)).names)
        return _call(str(location), schema)
    except StorageError:
        raise
    except Exception:  # noqa: BLE001  not Parquet at all
        return ()


def write_bytes_atomic(url: str, data: bytes) -> None:
    """Write a remote file so that readers see it whole or not at all: the bytes go to a
    temporary sibling first, then one copy or rename gives the final name (an object store
    creates the final object in one request)."""
    folder, name = url.rstrip("/").rsplit("/", 1)
    tmp = f"{folder}/.{name}.tmp-{uuid.uuid4().hex[:8]}"

    def put(fs, path):
        _, tmp_path = filesystem(tmp)
        fs.pipe_file(tmp_path, data)
        try:
            fs.mv(tmp_path, path)
        finally:
            if fs.exists(tmp_path):
                fs.rm(tmp_path)

    _call(url, put)


def upload_folder(local: Path, url: str, last: str) -> None:
    """Copy the finished local folder `local` to `url`, file by file, the file named `last`
    (the one readers look for first, e.g. metadata.json) after every other: a reader never
    finds it beside a partial upload, and a failed upload removes the files it put. `url` must
    not exist yet (checked by the caller)."""
    files = sorted(p for p in local.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name == last)  # stable: `last` goes to the end

    def put_all(fs, path):
        done = []
        try:
            for file in files:
                target = f"{path.rstrip('/')}/{file.relative_to(local).as_posix()}"
                fs.put_file(str(file), target)
                done.append(target)
        except BaseException:  # remove what this upload created, and only that
            for target in done:
                try:
                    fs.rm_file(target)
                except Exception:  # noqa: BLE001  the original error matters more
                    pass
            raise

    _call(url, put_all)
