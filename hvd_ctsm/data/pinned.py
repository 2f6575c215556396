"""A dataset replaced while a step reads it: found at the first file opened after the swap, and
said in one line.

`features --overwrite` builds the new dataset beside the old one, swaps it into place and removes
the old folder (hvd_ctsm.files.outputs.publish). A reader names files by path, and the new build's
files have the old one's names (part-00000.parquet, ...): before, a step that opened a file after
the swap read the new build's rows under the old build's metadata and vocabulary without a word
(the trainer's next epoch read the new build whole; a scorer named items from one build with
indices from the other).

So every local split a step opens is pinned to the build it opened (metadata.json's digest,
dataset_meta.metadata_sha256, which differs for every build), and each file a reader opens is
checked after it is open: a folder's builds only move forward, so if the folder still holds the
pinned build once the file is open, the file is of that build (an open file stays readable after
its folder is removed). Otherwise the step stops, in one line, before it uses a row of the file.
Only local datasets are pinned: a URL output is never replaced (outputs.check_new_url).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from hvd_ctsm.data.dataset_meta import DatasetError, metadata_sha256


class DatasetReplacedError(DatasetError):
    """The dataset folder holds another build than the one this step opened."""


class Pin:
    """The build a dataset folder held when a step opened it."""

    def __init__(self, folder: Path, meta: dict):
        self.folder = folder
        self.metadata = os.path.join(folder, "metadata.json")
        self.sha256 = metadata_sha256(meta)
        self.seen: tuple | None = None  # metadata.json's identity once it was read as this build

    def check(self) -> None:
        """Raise DatasetReplacedError unless the folder still holds this build."""
        try:  # the same file as last time: one stat, no open (Petastorm's rows check each one)
            if _identity(os.stat(self.metadata)) == self.seen:
                return
        except OSError:  # said below
            pass
        try:
            with open(self.metadata, "rb") as file:
                seen = _identity(os.fstat(file.fileno()))
                same = metadata_sha256(json.loads(file.read())) == self.sha256
        except (OSError, ValueError):  # gone (between a swap's renames, or removed): not ours
            same = False
        if not same:
            raise DatasetReplacedError(
                f"{self.folder} was replaced while this step read it (rebuilt by another feature "
                "job, e.g. features --overwrite); nothing of the new build was used: run the "
                "step again")
        self.seen = seen


def _identity(stat: os.stat_result) -> tuple:
    """A file's identity: another file, or this one rewritten, has another."""
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


_PINS: dict[str, Pin] = {}  # a split's folder (resolved) -> the build its dataset was opened as


def pin_split(folder: Path, split: str, meta: dict) -> Pin:
    """Pin `folder`'s split `split` to the build `meta` describes (the metadata the step read);
    a later opening of the same folder (a notebook's next step) pins its own build."""
    pin = Pin(folder, meta)
    _PINS[str(folder / split)] = pin
    return pin


def check_split(split_folder: str | Path) -> None:
    """Stop if the dataset of a pinned split folder was replaced; nothing for one not pinned."""
    pin = _PINS.get(str(split_folder))
    if pin is not None:
        pin.check()


@contextmanager
def failure_said_as_replaced(check: Callable[[], None] | None, errors=(Exception,)):
    """Run the block's read; if it fails with one of `errors`, `check` (a pin's) first says the
    dataset was replaced when it was (a file gone, or of another build, because of the swap),
    else the error stands. `check` None (a remote dataset: never pinned) checks nothing."""
    try:
        yield
    except errors:
        if check is not None:
            check()
        raise


def open_checked(path: str | Path):
    """`path`, a file of a split, opened to read, once its dataset is known to be the pinned
    build (check_split); a file gone because the dataset was replaced says that."""
    split_folder = Path(path).parent
    with failure_said_as_replaced(lambda: check_split(split_folder), FileNotFoundError):
        file = open(path, "rb")
    try:
        check_split(split_folder)
    except BaseException:
        file.close()
        raise
    return file


def rows_of_the_pinned_build(rows, split_folder: str | Path) -> Iterator:
    """Petastorm opens files itself: each row is passed on once the dataset is known to be still
    the build the step opened, and so was when the row's file was opened. A file Petastorm
    failed to open or read (gone, or fewer row groups in the new build's file of that name) is
    said to be the swap's, when it was."""
    split_folder = str(split_folder)  # the key, once, not per row
    rows = iter(rows)  # not failure_said_as_replaced: the end (StopIteration) is no failure
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except Exception:
            check_split(split_folder)
            raise
        check_split(split_folder)
        yield row
