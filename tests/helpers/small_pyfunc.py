"""A registered pyfunc model in seconds: a small CTSM (untrained weights, one client attribute)
as a folder-registry version, registered by deploy's own register_version in a local store.
For what the pyfunc flavour does with its input, where `./run.sh demo` (minutes) would add
nothing: the scores of untrained weights are as good as any for that."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

ITEMS = [str(item) for item in range(10, 30)]  # raw ids as the features' vocab.json holds them
REGIONS = ["north", "south"]
MAX_LEN = 8


def version_folder(folder: Path) -> Path:
    """model.pt (with its checksum), vocab.json and metadata.json, as deploy copies them."""
    import torch

    from hvd_ctsm.config.model_config import ModelConfig
    from hvd_ctsm.model.checkpoint import save_state
    from hvd_ctsm.model.ctsm import CTSM, ModelSizes

    folder.mkdir(parents=True)
    vocab = {"items": ["<pad>", *ITEMS], "categories": ["<unknown>"],
             "attrs": {"region": ["<unknown>", *REGIONS]}}
    vocab_bytes = (json.dumps(vocab) + "\n").encode()
    digest = hashlib.sha256(vocab_bytes).hexdigest()
    (folder / "vocab.json").write_bytes(vocab_bytes)
    (folder / "metadata.json").write_text(json.dumps(
        {"vocab_sha256": digest, "attrs": ["region"], "max_len": MAX_LEN}))
    torch.manual_seed(0)
    sizes = ModelSizes(num_items=len(ITEMS) + 1, num_event_types=5, attr_sizes=[3],
                       max_len=MAX_LEN)
    config = ModelConfig(dim=16, layers=1, heads=2)
    save_state(folder / "model.pt", {
        "model": CTSM(sizes, config).state_dict(), "sizes": dataclasses.asdict(sizes),
        "config": {"model": dataclasses.asdict(config)}, "vocab_sha256": digest})
    return folder


def registered_model(root: Path) -> str:
    """The version folder registered (as deploy does) in a SQLite store under `root`; the URI
    of the registered model's files, which mlflow.pyfunc.load_model and spark_udf read
    without a tracking URI."""
    from mlflow import MlflowClient

    from hvd_ctsm.tracking.link import RunLink
    from hvd_ctsm.tracking.registry import register_version

    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("pyfunc", (root / "artifacts").as_uri())
    run = client.create_run(experiment)
    link = RunLink(uri, experiment, run.info.run_id, "ctsm")
    name, number = register_version(link, version_folder(root / "v0001"),
                                    {"gate": {"passed": True}})
    client.set_terminated(run.info.run_id)
    return client.get_model_version_download_uri(name, number)
