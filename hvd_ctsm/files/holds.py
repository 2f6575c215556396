"""Holds on output folders: one process at a time writes a run folder or a pipeline's --work.

A hold is an flock on the folder itself, taken without waiting: no file is added, and the kernel
drops it when its holder dies (kill -9 too). NFS cannot lock a folder (its client takes an
exclusive flock only on a file open for writing, flock(2)): there the hold is an flock on the
file outputs.HOLD inside the folder. That file is made only in a folder that is empty or ours
(never in a user's folder, which the command then refuses), and stays: removing it would let
a process that opened it before the removal lock a file nobody else can find. Every check of
what a folder holds passes over it (outputs.is_empty). Where no file can be locked either (a
mount without a lock manager), or where the hold file is another user's that this one may not
open for writing, the folder goes unguarded, and a warning says so once.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

from hvd_ctsm.files import outputs


class FolderBusy(Exception):
    """Another process holds the folder (lock_folder)."""


# The folders lock_folder warned of, in this process and the one that started it: a pipeline's
# training (horovodrun, torchrun) does not warn again of its run folder inside the pipeline's.
SAID_UNGUARDED = "HVD_CTSM_SAID_UNGUARDED"


def say_unguarded_once(folder: Path, why: str, unguarded: str) -> None:
    """Warn that `folder` goes unguarded (`why`: what follows its name), unless it or a folder
    holding it was said so."""
    said = [Path(p) for p in os.environ.get(SAID_UNGUARDED, "").split(os.pathsep) if p]
    where = folder.resolve()
    if any(s == where or s in where.parents for s in said):
        return
    os.environ[SAID_UNGUARDED] = os.pathsep.join(map(str, [*said, where]))
    print(f"warning: {folder} {why}: {unguarded}", file=sys.stderr)


def _cannot_lock(strerror: str) -> str:
    return f"is on a file system that cannot lock its folders or files ({strerror})"


def not_this_users_to_lock(lock_file: Path) -> str:
    """Why `lock_file`, another user's (made in that user's umask), holds nothing here: an NFS
    client takes an exclusive flock only on a file open for writing (flock(2)). Said by a run
    folder's hold and the registry's deploy lock alike."""
    return f"locks only files open for writing, and {lock_file} is not this user's to write"


def lock_folder(folder: Path, unguarded: str = "") -> int:
    """Hold `folder` (see the module doc) without waiting; returns the descriptor that holds it
    until closed. FolderBusy when another process holds it. `unguarded` says what goes
    unguarded where nothing can be locked, and what to do; empty, the caller only looks
    (a check): no hold file is made, and nothing is said."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        _lock(fd, folder)
        return fd
    except OSError:  # a folder this file system cannot lock: its hold file, then
        os.close(fd)
    making = bool(unguarded) and _may_make(folder)
    hold_file = folder / outputs.HOLD
    try:
        hold = os.open(hold_file, os.O_RDWR | (os.O_CREAT if making else 0), 0o666)
    except OSError as exc:
        if not making:  # none there (a check makes none; a folder not ours is then refused)
            return os.open(folder, os.O_RDONLY)  # holds nothing: for the caller to close
        hold = os.open(folder, os.O_RDONLY)
        if isinstance(exc, PermissionError) and hold_file.exists():  # in another user's umask
            why = (f"cannot be held: its file system {not_this_users_to_lock(hold_file)} "
                   "(make it writable for everyone who writes here)")
        else:
            why = _cannot_lock(exc.strerror)
    else:
        try:
            _lock(hold, folder)
            return hold
        except OSError as exc:  # a mount without a lock manager (ENOLCK)
            why = _cannot_lock(exc.strerror)
    if unguarded:
        say_unguarded_once(folder, why, unguarded)
    return hold


def _lock(fd: int, folder: Path) -> None:
    """flock `fd` without waiting; FolderBusy (with `fd` closed) when another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FolderBusy(str(folder)) from None


def _may_make(folder: Path) -> bool:
    """A hold file is made only in an empty folder or one of ours: never in a user's folder."""
    return outputs.is_empty(folder) or outputs.marker(folder) is not None
