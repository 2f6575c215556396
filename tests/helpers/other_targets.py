"""A feature folder with other test targets and the same vocabulary, from a built one (as
features rebuilt from newer events with previous_vocab): for a champion measured on other data."""

import json
import shutil
from pathlib import Path


def other_targets(features: Path, out: Path) -> Path:
    """A copy of `features` whose test split is its validation split."""
    shutil.copytree(features, out)
    shutil.rmtree(out / "test")
    shutil.copytree(features / "validation", out / "test")
    meta = json.loads((out / "metadata.json").read_text())
    meta["splits"]["test"] = {**meta["splits"]["validation"], "path": "test"}
    (out / "metadata.json").write_text(json.dumps(meta))
    return out
