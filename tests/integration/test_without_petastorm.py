"""Datasets without Petastorm: the feature job writes the same files with it or without it, and
Petastorm itself (on the classic stack) reads what the current stack wrote without it. The whole
chain without Petastorm is the current stack's suite (Petastorm 0.13 does not run on pyarrow >=
15), and the feature job without it on Spark 3.5 and pyarrow 14 is tests/integration/test_wheel.py's
runtime-like environment."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from hvd_ctsm.data.batches import open_reader, split_url
from tests.conftest import REPO, TINY_SOURCE
from tests.integration.test_arrow_reader import assert_same_rows

pytestmark = pytest.mark.spark


@pytest.mark.petastorm
def test_both_writers_write_the_same_files(spark, tmp_path, monkeypatch):
    from spark_jobs.build_features import build_features
    from spark_jobs.config import FeatureConfig

    outs = {}
    for writer in ("auto", "parquet"):
        monkeypatch.setenv("HVD_CTSM_WRITER", writer)
        outs[writer] = tmp_path / writer
        build_features(spark, FeatureConfig(source=TINY_SOURCE, out=str(outs[writer]),
                                            max_len=40, row_groups=8))
    for split in ("train", "validation", "test", "serving"):
        with_petastorm, without = outs["auto"] / split, outs["parquet"] / split
        names = sorted(p.name for p in with_petastorm.glob("*.parquet"))
        assert names and names == sorted(p.name for p in without.glob("*.parquet"))
        for name in names:
            assert (with_petastorm / name).read_bytes() == (without / name).read_bytes(), name
        assert common_metadata(without) == common_metadata(with_petastorm)
    # Petastorm's own reader reads the dataset written without it: the same rows as ours.
    url = split_url(outs["parquet"], "train")
    for reader in ("petastorm", "arrow"):
        monkeypatch.setenv("HVD_CTSM_READER", reader)
        with open_reader(url, 1, 2, seed=3, shuffle=True) as rows:
            outs[reader] = [row._asdict() for row in rows]
    assert_same_rows(outs["arrow"], outs["petastorm"])


def common_metadata(split: Path) -> tuple:
    """What Petastorm's readers take from _common_metadata: the schema, the Unischema (the same
    pickle as make_schema's) and the row groups of each file."""
    import pickle

    import pyarrow.parquet as pq

    from hvd_ctsm.data.petastorm_metadata import ROW_GROUPS_KEY, UNISCHEMA_KEY
    from hvd_ctsm.data.schema import make_schema

    meta = pq.read_metadata(split / "_common_metadata")
    values = meta.metadata
    assert values[UNISCHEMA_KEY] == pickle.dumps(make_schema())
    spark_schema = values[b"org.apache.spark.sql.parquet.row.metadata"]
    return (meta.schema.to_arrow_schema().remove_metadata(), values[UNISCHEMA_KEY],
            json.loads(values[ROW_GROUPS_KEY]), spark_schema)


# Run by the classic stack's Python: its Petastorm's two readers over a split.
PETASTORM_READS = """
import json, sys
from petastorm import make_batch_reader, make_reader
url = sys.argv[1]
with make_reader(url, reader_pool_type="dummy", num_epochs=1, shuffle_row_groups=False) as r:
    rows = [{k: [v.dtype.str, list(v.shape), v.tolist()] if hasattr(v, "dtype") else v
             for k, v in row._asdict().items()} for row in r]
with make_batch_reader(url, reader_pool_type="dummy", num_epochs=1,
                       shuffle_row_groups=False) as r:
    clients = [c for batch in r for c in batch.client_id.tolist()]
print(json.dumps({"rows": rows, "batch_clients": clients}))
"""


@pytest.mark.both_stacks
def test_petastorm_on_the_classic_stack_reads_what_the_current_stack_wrote(tiny_features):
    """The dataset this stack's feature job wrote without Petastorm (on the current stack: Spark
    4, pyarrow >= 15), read by Petastorm 0.13's make_reader and make_batch_reader in the classic
    stack's venv: the same rows as our reader's, in the same order."""
    if importlib.util.find_spec("petastorm") is not None:
        pytest.skip("Petastorm is installed: this stack's own tests read its datasets with it")
    classic = REPO / ".venv" / "bin" / "python"
    if not classic.exists():
        pytest.skip("no classic stack here (./run.sh setup); ./run.sh test sets up both")
    url = split_url(tiny_features, "train")
    proc = subprocess.run([str(classic), "-c", PETASTORM_READS, url], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(proc.stdout.splitlines()[-1])
    with open_reader(url, 0, 1, seed=None, shuffle=False) as rows:
        rows = [row._asdict() for row in rows]
    ours = [{k: [v.dtype.str, list(v.shape), v.tolist()] if hasattr(v, "dtype") else v
             for k, v in row.items()} for row in rows]
    assert len(ours) > 0 and theirs["rows"] == ours
    assert theirs["batch_clients"] == [str(row["client_id"]) for row in rows]
