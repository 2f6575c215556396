"""Atomic file writes, shared by the feature job, the trainer and deploy (standard library only,
so the Spark job can import it without torch)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hvd_ctsm.errors import DISK_FULL


def _umask() -> int:
    try:  # Linux says it without changing it
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0)  # elsewhere: set it, then put it back at once
    os.umask(mask)
    return mask


# What open() gives a new file and mkdir a new folder under this process's umask (0o644 and
# 0o755 under the usual 022). mkstemp and mkdtemp make theirs 0o600 and 0o700: the model, its
# metadata and a deployed version were then unreadable to any other user (a serving job, a
# Spark executor running as another user, a colleague). Read once, at import.
_MASK = _umask()
FILE_MODE = 0o666 & ~_MASK
FOLDER_MODE = 0o777 & ~_MASK


def set_mode(target: int | Path, mode: int) -> None:
    """chmod a path or an open file descriptor to FILE_MODE or FOLDER_MODE; a filesystem that
    refuses modes (some FUSE mounts of object stores) keeps its own, as for a plain write."""
    try:
        os.chmod(target, mode)
    except (OSError, NotImplementedError):
        pass


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


TEMPORARY = ".{}.*.tmp"  # atomic_write_bytes' temporary file for NAME, as a glob pattern


def is_temporary(file: Path, of: str) -> bool:
    """`file` is atomic_write_bytes' temporary file for a file named `of` (a write under way,
    or one a killed process never finished)."""
    return file.match(TEMPORARY.format(of))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write data to path so that path is never seen half-written: temp file, fsync, rename."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:  # its message named our temporary file, which the user never typed
        if exc.errno in DISK_FULL:  # no inode left: not a permission to fix
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise PermissionError(exc.errno, f"cannot write there ({exc.strerror})",
                              str(path)) from None
    try:
        set_mode(fd, FILE_MODE)  # as open() would make it, not mkstemp's 0o600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.filename is None:  # a failed write names no file: say which one
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
