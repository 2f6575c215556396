"""A feature dataset as every consumer takes it: one object that owns where it is, its checked
metadata, its splits' URLs, the sizes a model takes from it and the check that a model indexes
items as it does.

    dataset = Dataset.open("runs/features")   # a missing or damaged dataset stops here
    url = dataset.split("train")              # checked once per process (verify_split)
    dataset.check_model(state, "the model", "score with the features it was trained on")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hvd_ctsm.data.dataset_meta import (DatasetError, DatasetMeta, check_same_vocabulary,
                                        item_categories, item_tags, read_metadata, read_vocab)
from hvd_ctsm.data.pinned import Pin, failure_said_as_replaced
from hvd_ctsm.data.schema import EVENT_TYPES


@dataclass(frozen=True)
class Dataset:
    path: str  # a local folder or a URL (hvd_ctsm.files.storage)
    meta: DatasetMeta

    @classmethod
    def open(cls, path: str | Path) -> Dataset:
        return cls(str(path), read_metadata(path))

    def split(self, name: str) -> str:
        """The split's URL for the readers, its files checked first (once per process), the
        readers held to this build (hvd_ctsm.data.pinned)."""
        from hvd_ctsm.data.batches import split_url

        return split_url(self.path, name, self.meta)

    def sizes(self, categories: bool = False, tags: bool = False) -> dict:
        """The model's sizes (hvd_ctsm.model.ctsm.ModelSizes' fields); from vocab.json also the
        items' categories (model.item_category) and tags (model.item_tags) when asked for."""
        sizes = {"num_items": self.meta.num_items, "num_event_types": len(EVENT_TYPES) + 1,
                 "attr_sizes": self.meta.attr_sizes, "max_len": self.meta.max_len}
        if categories:
            sizes["item_category"] = self._of_this_build(item_categories, self.path, self.meta)
        if tags:
            sizes["item_tags"] = self._of_this_build(item_tags, self.path, self.meta)
        return sizes

    def items(self) -> list[str]:
        """Raw item ids by index (vocab.json's `items`: what scores name)."""
        return self._of_this_build(read_vocab, self.path)[1]["items"]

    def _of_this_build(self, read_from_vocab, *args):
        """What `read_from_vocab(*args)` reads from vocab.json, once the folder is known to hold
        still the build this Dataset opened (hvd_ctsm.data.pinned): after a features --overwrite
        meanwhile, vocab.json is the new build's, and a scorer named items of one build by the
        other's indices without a word. Its error too is said as the dataset replaced, when it
        was (a vocabulary read between the swap's renames)."""
        from hvd_ctsm.files import storage
        pin = None if storage.is_remote(self.path) else Pin(storage.local_path(self.path),
                                                             self.meta)
        with failure_said_as_replaced(pin and pin.check, DatasetError):
            value = read_from_vocab(*args)
        if pin:
            pin.check()
        return value

    def check_model(self, state: dict, what: str, fix: str) -> None:
        """`state` (a model.pt's) indexes items as this dataset does; else one line with `fix`."""
        check_same_vocabulary(state, self.meta, what, self.path, fix)
