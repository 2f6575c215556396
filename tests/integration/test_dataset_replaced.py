"""A dataset rebuilt (`features --overwrite`) while a step reads it: the step finishes on the
build it opened or stops in one line, never reads the new build's rows under the old one's
metadata and vocabulary.

A real dataset written by the feature job, copied; the new build is a real folder swapped in by
the real publish (hvd_ctsm.files.outputs) with the old one removed, as the feature job does.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from hvd_ctsm.data.arrow_reader import row_groups
from hvd_ctsm.data.batches import open_reader
from hvd_ctsm.data.dataset import Dataset
from hvd_ctsm.data.pinned import DatasetReplacedError
from hvd_ctsm.files import outputs

pytestmark = pytest.mark.both_stacks

REPLACED = "was replaced while this step read it"


READERS = ["arrow"] + (["petastorm"] if importlib.util.find_spec("petastorm") else [])


def rebuild(data: Path, train_files: int | None = None) -> None:
    """Swap a new build into `data`: the same files (or only the first `train_files` of its
    train split), its first item renamed (as a new build's vocabulary may index items
    differently), its metadata saying so; the old folder removed."""
    stage = data.with_name(f".{data.name}.tmp-test")
    shutil.copytree(data, stage)
    if train_files is not None:
        for extra in sorted((stage / "train").glob("part-*.parquet"))[train_files:]:
            extra.unlink()
    vocab = json.loads((stage / "vocab.json").read_text())
    vocab["items"][1] = "an item of the new build"
    raw = json.dumps(vocab).encode()
    (stage / "vocab.json").write_bytes(raw)
    meta = json.loads((stage / "metadata.json").read_text())
    meta["vocab_sha256"] = hashlib.sha256(raw).hexdigest()
    (stage / "metadata.json").write_text(json.dumps(meta))
    outputs.publish(stage, data, overwrite=True)


@pytest.fixture
def data(tiny_features, tmp_path) -> Path:
    copy = tmp_path / "features"
    shutil.copytree(tiny_features, copy)
    return copy


def test_a_reader_mid_split_stops_at_the_next_file_of_the_new_build(data):
    dataset = Dataset.open(data)
    with open_reader(dataset.split("train"), 0, 1, seed=None, shuffle=False) as reader:
        rows = iter(reader)
        next(rows)  # the first row group, of the build it opened
        rebuild(data)
        with pytest.raises(DatasetReplacedError, match=REPLACED):
            list(rows)


def test_the_next_epoch_and_the_vocabulary_of_a_replaced_dataset_are_refused(data):
    dataset = Dataset.open(data)
    url = dataset.split("train")
    with open_reader(url, 0, 1, seed=None, shuffle=False) as reader:
        first_epoch = len(list(reader))
    rebuild(data)
    with pytest.raises(DatasetReplacedError, match=REPLACED):
        with open_reader(url, 0, 1, seed=None, shuffle=False) as reader:
            list(reader)
    with pytest.raises(DatasetReplacedError, match=REPLACED):
        dataset.items()  # before: the new build's item names, for the old build's indices
    with pytest.raises(DatasetReplacedError, match=REPLACED):
        dataset.split("test")  # a split not opened yet, checked against the old listing
    # A step that opens the new build reads it whole, in the same process.
    rebuilt = Dataset.open(data)
    with open_reader(rebuilt.split("train"), 0, 1, seed=None, shuffle=False) as reader:
        assert len(list(reader)) == first_epoch
    assert rebuilt.items()[1] == "an item of the new build"


@pytest.mark.parametrize("reader", READERS)
def test_a_swap_between_two_files_to_a_build_with_fewer_is_said_as_a_swap(data, reader,
                                                                         monkeypatch):
    """Swapped just as the reader finished a file, to a build with fewer files: the next file it
    opens is gone. Petastorm's own open said only `No such file or directory: .../part-00001`."""
    monkeypatch.setenv("HVD_CTSM_READER", reader)
    dataset = Dataset.open(data)
    url = dataset.split("train")
    first_group = row_groups(url)[0].rows
    with open_reader(url, 0, 1, seed=None, shuffle=False) as rows:
        rows = iter(rows)
        for _ in range(first_group):  # the first file's rows, of the build it opened
            next(rows)
        rebuild(data, train_files=1)
        with pytest.raises(DatasetReplacedError, match=REPLACED):
            list(rows)
