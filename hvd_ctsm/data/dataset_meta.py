"""metadata.json of a feature dataset: read once, checked, and given typed names.

The feature job (spark_jobs.build_features) writes it beside the splits. Every reader of a
dataset (trainer, backtest, scorer, pyfunc) goes through `read_metadata`, which refuses, in one
line and before any work starts, a folder without it, another schema version, or a field the
package needs that is missing or of the wrong type. No torch, Spark or Horovod here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from hvd_ctsm.data.schema import SCHEMA_VERSION

REBUILD = "rebuild the features with spark_jobs.build_features"


class DatasetError(ValueError):
    """The dataset cannot be trained on; the message says why and what to do."""


class DatasetMeta(dict):
    """The JSON as the feature job wrote it (still a dict, so that it is logged and pickled as
    is), with typed names for the fields the package reads."""

    @property
    def max_len(self) -> int:
        """Events per history window (the model's positions)."""
        return int(self["max_len"])

    @property
    def num_items(self) -> int:
        """Item vocabulary size, index 0 (padding) included."""
        return int(self["vocab"]["items"])

    @property
    def train_targets_per_item(self) -> float:
        """The training split's targets per catalog item (padding not counted)."""
        return int(self["splits"]["train"]["targets"]) / max(self.num_items - 1, 1)

    @property
    def attr_names(self) -> list[str]:
        """Client attributes, in the order of the `client_attrs` column."""
        return list(self.get("attrs", []))

    @property
    def attr_sizes(self) -> list[int]:
        """Vocabulary size of each client attribute, in attr_names' order."""
        return [int(n) for n in self["vocab"].get("attrs", {}).values()]

    @property
    def vocab_sha256(self) -> str:
        """Digest of vocab.json's bytes: a model and a dataset index items alike iff equal."""
        return str(self.get("vocab_sha256", ""))

    @property
    def splits(self) -> dict:
        """Split name -> its folder, rows and files as written (verify_split checks them)."""
        return dict(self.get("splits", {}))


def metadata_sha256(meta: dict) -> str:
    """A feature build's identity: the digest of its metadata.json's content (key order and
    spacing aside), wherever the folder is and however its path is written. The feature job
    writes every split's files (rows, bytes), the vocabulary's digest, the source, the cutoffs
    and the build's timings there, so another build, even of the same events, has another."""
    text = json.dumps(meta, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def read_metadata(data_dir: str | Path) -> DatasetMeta:
    """metadata.json of a feature dataset (a folder or a URL: hvd_ctsm.files.storage), checked."""
    from hvd_ctsm.files import storage
    path = storage.join(data_dir, "metadata.json")
    fix = "point --data at a folder written by spark_jobs.build_features"
    if not storage.is_dir(data_dir):
        raise DatasetError(f"{data_dir} is not a folder: {fix}")
    try:
        meta = json.loads(storage.read_bytes(path))
    except FileNotFoundError as exc:
        raise DatasetError(f"{path} not found: {fix}") from exc
    except storage.StorageError:
        raise
    except ValueError as exc:
        raise DatasetError(f"{path} is not valid JSON ({exc}): {REBUILD}") from exc
    if not isinstance(meta, dict):
        raise DatasetError(f"{path} holds a {type(meta).__name__}, not an object: {REBUILD}")
    version = meta.get("schema_version")
    if version != SCHEMA_VERSION:
        raise DatasetError(f"{data_dir} has schema version {version}, this trainer reads "
                           f"{SCHEMA_VERSION}: rebuild the features with this version")
    check_fields(meta, path)
    return DatasetMeta(meta)


def check_fields(meta: dict, path: str) -> None:
    """The fields every reader needs: positive integers for max_len and vocab.items."""
    vocab = meta.get("vocab")
    for name, value in (("max_len", meta.get("max_len")),
                        ("vocab.items", vocab.get("items") if isinstance(vocab, dict) else None)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DatasetError(f"{path}: {name} is {value!r}, expected a positive integer "
                               f"(a damaged or hand-edited file): {REBUILD}")


def read_vocab(data_dir: str | Path) -> tuple[str, dict]:
    """The dataset's vocab.json (its path, its content); missing, not JSON, or not the bytes
    the dataset was written with (metadata.json's vocab_sha256): refused. An edited vocab.json
    renamed items without a word: scores named other items, and training learnt them."""
    from hvd_ctsm.files import storage
    path = storage.join(data_dir, "vocab.json")
    try:
        raw = storage.read_bytes(path)
    except FileNotFoundError as exc:
        raise DatasetError(f"{path} is missing ({exc}): {REBUILD}") from exc
    return path, vocab_as_written(path, raw, read_metadata(data_dir).vocab_sha256)


def vocab_as_written(path: str | Path, raw: bytes, written: str) -> dict:
    """vocab.json's content from its bytes, which must be those whose sha256 metadata.json
    recorded (`written`, when it has one)."""
    try:
        vocab = json.loads(raw)
    except ValueError as exc:
        raise DatasetError(f"{path} is not JSON ({exc}): {REBUILD}") from exc
    if written and hashlib.sha256(raw).hexdigest() != written:
        raise DatasetError(f"{path} is not the vocabulary this dataset was written with (its "
                           "sha256 differs from metadata.json's vocab_sha256: edited or "
                           f"replaced): put the original back, or {REBUILD}")
    return vocab


def item_categories(data_dir: str | Path, meta: DatasetMeta) -> list[int]:
    """Each item's category index from the dataset's vocab.json (0 = unknown), checked."""
    path, vocab = read_vocab(data_dir)
    categories = vocab.get("item_category")
    if (not isinstance(categories, list) or len(categories) != meta.num_items
            or not all(isinstance(c, int) and c >= 0 for c in categories)):
        raise DatasetError(f"{path}: item_category is not one index per item "
                           f"({meta.num_items} items): {REBUILD}")
    return categories


def item_tags(data_dir: str | Path, meta: DatasetMeta,
              required: bool = True) -> list[list[int]] | None:
    """Each item's tag indices (genres, release-year era) from the dataset's vocab.json,
    checked; a dataset built before tags existed is refused with the fix, or with
    required=False gives None (a reader that can do without them)."""
    path, vocab = read_vocab(data_dir)
    tags, names = vocab.get("item_tags"), vocab.get("tags")
    if tags is None or names is None:
        if not required:
            return None
        raise DatasetError(f"{path} has no item tags (model.item_tags needs them): "
                           f"{REBUILD}, or set model.item_tags=false")
    if (not isinstance(tags, list) or len(tags) != meta.num_items
            or not all(isinstance(t, list) and all(isinstance(i, int) and 0 < i < len(names)
                                                   for i in t) for t in tags)):
        raise DatasetError(f"{path}: item_tags is not a list of tag indices per item "
                           f"({meta.num_items} items): {REBUILD}")
    return tags


def check_same_vocabulary(state: dict, meta: dict, what: str, data, fix: str) -> None:
    """A saved model or checkpoint (`state`) indexes items as the dataset (`meta`, read here or
    from a deployed copy of metadata.json) does: the same vocab.json bytes. The one check every
    reader of a model.pt or checkpoint makes."""
    if state.get("vocab_sha256") != DatasetMeta(meta).vocab_sha256:
        raise DatasetError(f"{what} was trained on another vocabulary than {data}: {fix}")
