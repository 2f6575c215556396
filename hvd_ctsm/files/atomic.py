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


TAIL_BYTES = 1 << 20  # a record is far shorter: its torn end lies within the file's last MiB


def append_line(path: Path, line: str) -> None:
    """Append one line (a JSON record of metrics.jsonl, train_log.jsonl, events.jsonl) whole
    or not at all, so that every line read back is a record (pandas.read_json(lines=True) and
    jq stop at a torn one). A write that fails (a full disk) is cut back off; a line an earlier
    process left torn (killed mid-write, or before this was so) is cut off before this one."""
    data = line.rstrip("\n").encode() + b"\n"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, FILE_MODE)
    try:
        start = _cut_torn_end(fd)
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError as exc:
            os.ftruncate(fd, start)
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
    finally:
        os.close(fd)


def _cut_torn_end(fd: int) -> int:
    """Cut the file after its last newline (a torn last line goes); its new size."""
    size = os.fstat(fd).st_size
    tail_at = max(0, size - TAIL_BYTES)
    tail = os.pread(fd, size - tail_at, tail_at)
    if not tail or tail.endswith(b"\n"):
        return size
    whole = tail_at + tail.rfind(b"\n") + 1  # 0 (the file's start) where no line ended
    os.ftruncate(fd, whole)
    return whole
