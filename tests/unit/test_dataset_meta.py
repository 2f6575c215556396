"""metadata.json read through DatasetMeta: typed names, and a damaged header refused in one line
before any reader or model is built (pure units: a hand-written metadata.json in a folder)."""

from __future__ import annotations

import hashlib
import json

import pytest

from hvd_ctsm.data.dataset_meta import (DatasetError, DatasetMeta, check_same_vocabulary,
                                        item_categories, item_tags, read_metadata)
from hvd_ctsm.data.schema import SCHEMA_VERSION


def write_meta(folder, **fields) -> None:
    meta = {"schema_version": SCHEMA_VERSION, "max_len": 50, "attrs": ["age", "city"],
            "vocab": {"items": 301, "attrs": {"age": 7, "city": 12}},
            "vocab_sha256": "ab" * 32, "splits": {"train": {"rows": 10}}} | fields
    (folder / "metadata.json").write_text(json.dumps(meta))


def write_vocab(folder, content) -> None:
    """vocab.json as the feature job writes it: its sha256 recorded in metadata.json."""
    raw = json.dumps(content).encode()
    (folder / "vocab.json").write_bytes(raw)
    meta = json.loads((folder / "metadata.json").read_text())
    meta["vocab_sha256"] = hashlib.sha256(raw).hexdigest()
    (folder / "metadata.json").write_text(json.dumps(meta))


def test_fields_have_typed_names(tmp_path):
    write_meta(tmp_path)
    meta = read_metadata(tmp_path)
    assert isinstance(meta, DatasetMeta) and isinstance(meta, dict)  # still logged as JSON
    assert (meta.max_len, meta.num_items) == (50, 301)
    assert (meta.attr_names, meta.attr_sizes) == (["age", "city"], [7, 12])
    assert meta.vocab_sha256 == "ab" * 32 and meta.splits == {"train": {"rows": 10}}
    assert json.loads(json.dumps(meta))["vocab"]["items"] == 301


@pytest.mark.parametrize("fields, named", [
    ({"max_len": None}, "max_len is None"),
    ({"max_len": "50"}, "max_len is '50'"),
    ({"max_len": 0}, "max_len is 0"),
    ({"vocab": {"items": True}}, "vocab.items is True"),
    ({"vocab": []}, "vocab.items is None"),
])
def test_a_missing_or_mistyped_field_is_refused_in_one_line(tmp_path, fields, named):
    write_meta(tmp_path, **fields)
    with pytest.raises(DatasetError, match="expected a positive integer") as refused:
        read_metadata(tmp_path)
    message = str(refused.value)
    assert named in message and "rebuild the features" in message and "\n" not in message


def test_another_schema_version_or_not_an_object_is_refused(tmp_path):
    write_meta(tmp_path, schema_version=SCHEMA_VERSION + 1)
    with pytest.raises(DatasetError, match="schema version"):
        read_metadata(tmp_path)
    (tmp_path / "metadata.json").write_text("[1, 2]")
    with pytest.raises(DatasetError, match="holds a list, not an object"):
        read_metadata(tmp_path)


def test_the_vocabulary_check_reads_a_plain_copy_of_metadata_too(tmp_path):
    """A deployed model carries metadata.json as a file: its plain JSON works the same."""
    write_meta(tmp_path)
    plain = json.loads((tmp_path / "metadata.json").read_text())
    check_same_vocabulary({"vocab_sha256": "ab" * 32}, plain, "the model", tmp_path, "retrain")
    with pytest.raises(DatasetError, match="another vocabulary"):
        check_same_vocabulary({"vocab_sha256": "cd" * 32}, read_metadata(tmp_path), "the model",
                              tmp_path, "retrain")


def test_item_categories_are_read_from_vocab_json_one_per_item(tmp_path):
    write_meta(tmp_path, vocab={"items": 3})
    meta = read_metadata(tmp_path)
    write_vocab(tmp_path, {"item_category": [0, 2, 1]})
    assert item_categories(tmp_path, meta) == [0, 2, 1]
    for bad in ([0, 1], [0, 1, -1], [0, 1, "2"], None):
        write_vocab(tmp_path, {"item_category": bad})
        with pytest.raises(DatasetError, match="item_category is not one index per item"):
            item_categories(tmp_path, meta)
    (tmp_path / "vocab.json").unlink()
    with pytest.raises(DatasetError, match="vocab.json is missing"):
        item_categories(tmp_path, meta)


def test_item_tags_are_read_from_vocab_json_and_an_older_dataset_is_refused(tmp_path):
    write_meta(tmp_path, vocab={"items": 3})
    meta = read_metadata(tmp_path)
    names = ["<pad>", "genre:Drama", "years:1995"]
    write_vocab(tmp_path, {"tags": names, "item_tags": [[], [1, 2], []]})
    assert item_tags(tmp_path, meta) == [[], [1, 2], []]
    for bad in ([[], [1]], [[], [1, 3], []], [[], [0], []], [[], 1, []], [[], ["1"], []]):
        write_vocab(tmp_path, {"tags": names, "item_tags": bad})
        with pytest.raises(DatasetError, match="item_tags is not a list of tag indices per item"):
            item_tags(tmp_path, meta)
    write_vocab(tmp_path, {"item_category": [0, 1, 1]})
    with pytest.raises(DatasetError, match="has no item tags"):
        item_tags(tmp_path, meta)
    assert item_tags(tmp_path, meta, required=False) is None  # a reader that can do without
    write_vocab(tmp_path, {"tags": names, "item_tags": [[], [1]]})
    with pytest.raises(DatasetError, match="not a list of tag indices"):  # damaged: refused
        item_tags(tmp_path, meta, required=False)


def test_a_dataset_owns_its_path_metadata_sizes_and_model_check(tmp_path):
    from hvd_ctsm.data.dataset import Dataset
    from hvd_ctsm.data.schema import EVENT_TYPES

    write_meta(tmp_path)
    dataset = Dataset.open(tmp_path)
    assert dataset.path == str(tmp_path) and dataset.meta.num_items == 301
    assert dataset.sizes() == {"num_items": 301, "num_event_types": len(EVENT_TYPES) + 1,
                               "attr_sizes": [7, 12], "max_len": 50}
    dataset.check_model({"vocab_sha256": "ab" * 32, "sizes": {"num_items": 301}}, "m", "fix")
    with pytest.raises(DatasetError, match="m was trained on another vocabulary .*: fix"):
        dataset.check_model({"vocab_sha256": "cd" * 32, "sizes": {"num_items": 301}}, "m", "fix")
    with pytest.raises(DatasetError, match="not a folder"):
        Dataset.open(tmp_path / "missing")


def test_a_vocab_json_edited_after_the_features_were_written_is_refused(tmp_path):
    """Two items swapped in vocab.json: scoring named other items than the model had learnt,
    exit 0; training and backtest took it too. metadata.json records the file's sha256."""
    write_meta(tmp_path, vocab={"items": 3})
    write_vocab(tmp_path, {"items": ["<pad>", "a", "b"]})
    from hvd_ctsm.data.dataset import Dataset

    dataset = Dataset.open(tmp_path)
    assert dataset.items() == ["<pad>", "a", "b"]
    (tmp_path / "vocab.json").write_text(json.dumps({"items": ["<pad>", "b", "a"]}))
    with pytest.raises(DatasetError, match="vocab.json is not the vocabulary this dataset was "
                                           "written with .* put the original back"):
        dataset.items()
