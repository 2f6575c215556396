"""The feature job end to end: real Spark, real Petastorm datasets read back with make_reader
(with our own reader where Petastorm is not installed)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from hvd_ctsm.data.schema import EVENT_TYPE_INDEX, SCHEMA_VERSION, SERVING_SPLIT, SPLITS
from hvd_ctsm.files import outputs
from spark_jobs.build_features import build_features, main
from spark_jobs.config import FeatureConfig
from spark_jobs.synthetic import SyntheticParams, generate_events_part
from spark_jobs.validate import StrictValidationError
from spark_jobs.write import count_row_groups
from tests.conftest import REPO

pytestmark = pytest.mark.spark


def read_split(path: Path, fields=None, cur_shard=None, shard_count=None) -> list[dict]:
    """The rows of a split as Petastorm's make_reader gives them; where Petastorm is not installed
    (the current stack), as our reader gives them: the same rows in the same order
    (tests/integration/test_arrow_reader.py compares the two on the classic stack)."""
    if importlib.util.find_spec("petastorm") is None:
        from hvd_ctsm.data.arrow_reader import open_arrow_reader

        with open_arrow_reader(path.resolve().as_uri(), cur_shard or 0, shard_count or 1,
                               None, False, fields) as rows:
            return [row._asdict() for row in rows]
    from petastorm import make_reader

    with make_reader(path.resolve().as_uri(), schema_fields=fields, reader_pool_type="dummy",
                     num_epochs=1, shuffle_row_groups=False, cur_shard=cur_shard,
                     shard_count=shard_count) as reader:
        return [row._asdict() for row in reader]


def assert_time_safe(row):
    ts = row["timestamp"]
    assert len(ts) == row["history_len"] == len(row["item"]) == row["client_attrs"].shape[0]
    assert (np.diff(ts) >= 0).all()
    assert len(row["target_pos"]) >= 1
    for pos, t in zip(row["target_pos"], row["target_time"], strict=True):
        assert 0 <= pos < len(ts)
        assert (ts[: pos + 1] < t).all(), "an input at or before target_pos is not earlier"
        assert pos + 1 == len(ts) or ts[pos + 1] >= t, "target_pos is not the last earlier event"


def check_serving_rows(out: Path, raw: pd.DataFrame) -> dict:
    """Serving rows against the raw events (client_id, item_id, timestamp, event_type, value):
    one per client, its last max_len events in the job's order (spark_jobs.split.EVENT_ORDER:
    timestamp, then input order), no targets, every item it had to exclude. `raw` is in input
    order."""
    meta = json.loads((out / "metadata.json").read_text())
    items = json.loads((out / "vocab.json").read_text())["items"]
    index = {item: i for i, item in enumerate(items)}
    raw = raw.assign(
        client_id=raw["client_id"].astype(str),
        item=raw["item_id"].astype(str).map(index),
        event_type=raw["event_type"].map(EVENT_TYPE_INDEX),
    ).sort_values(["client_id", "timestamp"], kind="stable")
    rows = read_split(out / SERVING_SPLIT)
    serving = {r["client_id"]: r for r in rows}
    assert len(serving) == len(rows) == meta["splits"][SERVING_SPLIT]["rows"]  # one per client
    assert meta["splits"][SERVING_SPLIT]["targets"] == 0
    assert set(serving) == set(raw["client_id"]) and len(rows) == meta["counts"]["clients"]
    for client, events in raw.groupby("client_id"):
        row, latest = serving[client], events.tail(meta["max_len"])
        for name in ("item", "event_type", "timestamp"):
            assert row[name].tolist() == latest[name].tolist(), (client, name)
        np.testing.assert_array_equal(row["value"], latest["value"].to_numpy(np.float32))
        assert row["history_len"] == len(latest) and row["client_attrs"].shape[0] == len(latest)
        assert all(len(row[f]) == 0 for f in ("target_pos", "target_item", "target_time"))
        assert set(row["client_items"]) == set(row["prior_items"]) == set(events["item"])
    return serving


@pytest.fixture(scope="module")
def ml_run(spark, ml100k, tmp_path_factory):
    out = tmp_path_factory.mktemp("ml") / "features"
    # 16 row groups a split, not the default 64: each costs 0.2-0.3 s of Spark tasks whatever
    # its size, and sharding over 2 and 4 ranks needs no more.
    summary = build_features(spark, FeatureConfig(source=f"movielens:{ml100k}", out=str(out),
                                                  row_groups=16))
    rows = {name: read_split(out / name) for name in SPLITS}
    return out, summary, rows


def test_ml100k_counts_as_the_data_set_states(ml_run):
    out, summary, rows = ml_run
    meta = json.loads((out / "metadata.json").read_text())
    c = meta["counts"]
    assert (c["input_rows"], c["used"], c["clients"], c["items"]) == (100_000, 100_000, 943, 1682)
    assert sum(c["rejected"].values()) == 0 and c["events_per_type"]["rating"] == 100_000
    assert meta["schema_version"] == SCHEMA_VERSION and meta["vocab"]["items"] == 1683
    raw = (out / "vocab.json").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == meta["vocab_sha256"]
    vocab = json.loads(raw)
    assert vocab["items"][0] == "<pad>" and len(vocab["items"]) == 1683
    assert len(vocab["item_category"]) == 1683 and vocab["item_category"][0] == 0
    assert len(vocab["item_tags"]) == 1683 and vocab["item_tags"][0] == []
    assert tag_names(vocab, "1") == ["genre:Animation", "genre:Children's", "genre:Comedy",
                                     "years:1995"]  # Toy Story
    assert vocab["year_edges"] == [1968, 1990, 1993, 1994, 1995, 1996, 1997]
    assert list(vocab["attrs"]) == ["age_bucket", "gender", "occupation"]
    assert all(v[0] == "<unknown>" for v in vocab["attrs"].values())
    assert len(vocab["attrs"]["occupation"]) == 22 and len(vocab["attrs"]["gender"]) == 3
    for name in ("validation", "test"):
        assert len(rows[name]) == meta["splits"][name]["rows"] == 943
        assert len({r["client_id"] for r in rows[name]}) == 943
    assert len(rows["train"]) == meta["splits"]["train"]["rows"]
    assert sum(len(r["target_item"]) for r in rows["train"]) == meta["splits"]["train"]["targets"]
    assert not list(out.parent.glob(".features.tmp-*")), "the staging folder was left behind"


def test_ml100k_serving_rows_end_with_each_clients_latest_event(ml_run, ml100k):
    out, _, rows = ml_run
    raw = pd.read_csv(
        ml100k / "u.data", sep="\t", names=["client_id", "item_id", "value", "timestamp"]
    ).assign(event_type="rating")
    serving = check_serving_rows(out, raw)
    assert len(serving) == 943 and count_row_groups(out / SERVING_SPLIT) >= 16
    assert max(r["history_len"] for r in serving.values()) == 200  # the longest are cut at L
    for test in rows["test"]:  # leave-last-out: the held-out test target is the newest input
        row = serving[test["client_id"]]
        assert row["item"][-1] == test["target_item"][0]
        assert row["timestamp"][-1] == test["target_time"][0]


def test_ml100k_no_leakage_including_tied_timestamps(ml_run):
    _, _, rows = ml_run
    ties = 0
    for name in SPLITS:
        for row in rows[name]:
            assert_time_safe(row)
            ts = row["timestamp"]
            # a target tied with the event after its target_pos proves ties were resolved early
            ties += sum(
                pos + 1 < len(ts) and ts[pos + 1] == t
                for pos, t in zip(row["target_pos"], row["target_time"], strict=True)
            )
            assert (row["item"] >= 1).all() and (row["client_attrs"] >= 1).all()
            # MovieLens attributes are known from the start: constant along the history
            assert (row["client_attrs"] == row["client_attrs"][0]).all()
        if name != "train":
            assert all(len(r["target_item"]) == 1 for r in rows[name])
            for r in rows[name]:
                assert set(r["item"]) <= set(r["prior_items"]) <= set(r["client_items"])
                assert r["target_item"][0] in r["client_items"]
    assert ties > 1000  # ML-100K has many ratings in the same second


def test_ml100k_row_groups_and_every_shard_has_rows(ml_run):
    out, _, rows = ml_run
    for name in SPLITS:
        groups = sum(pq.ParquetFile(f).num_row_groups for f in (out / name).glob("*.parquet"))
        assert groups == count_row_groups(out / name) >= 16
        for shards in (2, 4):
            seen = []
            for shard in range(shards):
                part = read_split(out / name, ["client_id"], cur_shard=shard, shard_count=shards)
                assert part, f"{name}: shard {shard} of {shards} is empty"
                seen += [r["client_id"] for r in part]
            assert sorted(seen) == sorted(r["client_id"] for r in rows[name])


def tag_names(vocab: dict, item: str) -> list[str]:
    return [vocab["tags"][t] for t in vocab["item_tags"][vocab["items"].index(item)]]


def _events_table(path: Path, clients, items, bad_rows=()):
    rows = [
        (f"c{c}", f"i{items[(c + k) % len(items)]}", 1_000 + 100 * k + c, "purchase", 1.0)
        for c in range(clients)
        for k in range(6)
    ]
    rows += list(bad_rows)
    df = pd.DataFrame(rows, columns=["client_id", "item_id", "timestamp", "event_type", "value"])
    df.to_parquet(path, index=False)
    return df


@pytest.mark.both_stacks
def test_events_source_accounting_vocab_stability_and_asof(spark, tmp_path):
    bad = [
        (None, "i1", 1_000, "purchase", 1.0),
        ("c1", "i1", -1, "view", 0.0),
        ("c1", "i1", 4_000_000_000, "view", 0.0),
        ("c2", "i2", 1_002, "click", 0.0),
        ("c0", "i1", 1_000, "purchase", 1.0),
    ]  # the last one duplicates c0's first event
    _events_table(tmp_path / "e1.parquet", 8, [1, 2, 3, 4, 5], bad)
    pd.DataFrame(
        {
            "client_id": ["c0", "c0", "c0", "c1"],
            "timestamp": ["", "1200", "1350", "0"],
            "tier": ["bronze", "silver", None, "gold"],
            "zone": ["", "", "north", "x"],
        }
    ).to_csv(tmp_path / "attrs.csv", index=False)
    pd.DataFrame(
        {
            "item_id": [f"i{i}" for i in range(1, 8)],
            "category": list("aabbbcc"),
            "genres": ["x|y", "y", None, "x", "y", "x", "z"],
            "year": [1995, 1987, None, 2001, 1995, None, 1990],
        }
    ).to_csv(tmp_path / "items.csv", index=False)
    common = dict(
        client_attrs=str(tmp_path / "attrs.csv"),
        item_attrs=str(tmp_path / "items.csv"),
        row_groups=4,
        max_timestamp=2_000_000_000,
    )
    one = build_features(
        spark,
        FeatureConfig(
            source=f"events:{tmp_path / 'e1.parquet'}", out=str(tmp_path / "o1"), **common
        ),
    )
    c = one["counts"]
    assert c["input_rows"] == 53 and c["used"] == 48
    assert {k: v for k, v in c["rejected"].items() if v} == {
        "null_client_id": 1,
        "negative_timestamp": 1,
        "future_timestamp": 1,
        "unknown_event_type": 1,
        "duplicate": 1,
    }
    # c0: tier bronze from the start, silver at 1200; zone north from 1350 (blank = no value)
    vocab1 = json.loads((tmp_path / "o1" / "vocab.json").read_text())
    tier, zone = vocab1["attrs"]["tier"], vocab1["attrs"]["zone"]
    test_rows = {r["client_id"]: r for r in read_split(tmp_path / "o1" / "test")}
    c0 = test_rows["c0"]
    expect = [
        [tier.index("bronze" if t < 1200 else "silver"), zone.index("north") if t >= 1350 else 0]
        for t in c0["timestamp"]
    ]
    assert c0["client_attrs"].tolist() == expect
    assert (test_rows["c5"]["client_attrs"] == 0).all()
    # a retrain with new items keeps every old index and appends the new ones
    _events_table(tmp_path / "e2.parquet", 8, [1, 3, 6, 7, 7])
    build_features(
        spark,
        FeatureConfig(
            source=f"events:{tmp_path / 'e2.parquet'}",
            out=str(tmp_path / "o2"),
            previous_vocab=str(tmp_path / "o1" / "vocab.json"),
            **common,
        ),
    )
    vocab2 = json.loads((tmp_path / "o2" / "vocab.json").read_text())
    n = len(vocab1["items"])
    assert vocab2["items"][:n] == vocab1["items"] and sorted(vocab2["items"][n:]) == ["i6", "i7"]
    assert vocab2["item_category"][:n] == vocab1["item_category"]
    assert vocab2["item_tags"][:n] == vocab1["item_tags"]  # tags keep their indices too
    assert vocab2["tags"][: len(vocab1["tags"])] == vocab1["tags"]
    assert vocab1["year_edges"] == vocab2["year_edges"] == [1990, 1995, 2001]  # eras are kept
    assert tag_names(vocab1, "i1") == ["genre:x", "genre:y", "years:1995..2000"]
    assert tag_names(vocab1, "i3") == [] and "genre:z" not in vocab1["tags"]
    assert tag_names(vocab2, "i7") == ["genre:z", "years:1990..1994"]
    assert vocab2["categories"][: len(vocab1["categories"])] == vocab1["categories"]
    assert vocab2["attrs"]["tier"] == tier
    items2 = {
        int(i)
        for r in read_split(tmp_path / "o2" / "train", ["target_item"])
        for i in r["target_item"]
    }
    assert {vocab2["items"][i] for i in items2} <= {"i1", "i3", "i6", "i7"}
    # an existing output is kept; --strict fails with the reason counts and leaves nothing
    with pytest.raises(outputs.OutputExistsError):
        build_features(
            spark,
            FeatureConfig(
                source=f"events:{tmp_path / 'e2.parquet'}", out=str(tmp_path / "o1"), **common
            ),
        )
    with pytest.raises(StrictValidationError, match="null_client_id=1"):
        build_features(
            spark,
            FeatureConfig(
                source=f"events:{tmp_path / 'e1.parquet'}",
                out=str(tmp_path / "o3"),
                strict=True,
                **common,
            ),
        )
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("o", ".o"))) == [
        "o1",
        "o2",
    ]


@pytest.mark.both_stacks
def test_cli_time_split_on_synthetic(tmp_path, spark, capsys):
    out = tmp_path / "syn"
    t1, t2 = "2020-10-01", "2021-01-01"
    argv = [
        "--source",
        "synthetic:clients=200,items=150,events=8000,seed=5",
        "--out",
        str(out),
        "--split",
        "time",
        "--cutoffs",
        f"{t1},{t2}",
        "--max-len",
        "20",
        "--row-groups",
        "8",
        "--master",
        "local[2]",
    ]
    assert main(argv) == 0
    said = capsys.readouterr()
    stages = [line.split(":")[1].split()[0] for line in said.out.splitlines()
              if line.startswith("features: ")]  # a line as each stage ends, then the table
    assert stages == ["reading", "8,000", "vocabularies", "examples", "wrote", "wrote", "wrote",
                      "wrote", "every"], said.out
    assert said.err == ""
    assert main(argv) == 2  # exists, no --overwrite: bad input, refused before Spark starts
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["split"] == {"kind": "time", "cutoffs": [1601510400, 1609459200]}
    assert meta["vocab"]["attrs"] == {"region": 11, "tier": 4}
    for name, low, high in (
        ("train", 0, 1601510400),
        ("validation", 1601510400, 1609459200),
        ("test", 1609459200, 2**62),
    ):
        rows = read_split(out / name)
        assert len(rows) == meta["splits"][name]["rows"] and count_row_groups(out / name) >= 8
        for row in rows:
            assert_time_safe(row)
            assert row["history_len"] <= 20
            assert ((low <= row["target_time"]) & (row["target_time"] < high)).all()
    # serving rows have no time cutoff: events after T2 beyond each client's test target are in
    params = SyntheticParams.parse(argv[1].split(":", 1)[1])
    raw = pd.concat([generate_events_part(params, part) for part in range(params.n_parts)])
    serving = check_serving_rows(out, raw)
    assert len(serving) == 200
    tests = read_split(out / "test", ["client_id", "target_time"])
    assert any(serving[t["client_id"]]["timestamp"][-1] > t["target_time"][0] for t in tests)


@pytest.mark.both_stacks
def test_module_runs_as_a_script():
    script = REPO / "spark_jobs" / "build_features.py"
    done = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=120,
    )
    assert done.returncode == 0 and "--previous-vocab" in done.stdout


@pytest.mark.slow
def test_ctrl_c_cancels_spark_and_ends_in_one_line_and_130(ml100k, tmp_path):
    """SIGINT to the command's process group, as Ctrl-C in a terminal sends it, as Spark
    builds the examples: before, PySpark's handler broke the driver's Py4J connection, and the
    command ended in Py4J tracebacks and "crashed" (exit 3). Now Spark's jobs are cancelled,
    one line says so, exit 130, and neither OUT nor a temporary folder is left."""
    import signal

    out = tmp_path / "features"
    proc = subprocess.Popen([sys.executable, "-m", "hvd_ctsm", "features", "--source",
                             f"movielens:{ml100k}", "--out", str(out), "--split",
                             "leave-last-out"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=REPO, start_new_session=True)
    seen = []
    for line in proc.stdout:  # the vocabularies are made: Spark's example jobs run next
        seen.append(line)
        if "vocabularies made" in line:
            os.killpg(proc.pid, signal.SIGINT)
            break
    rest = proc.stdout.read()
    assert proc.wait(timeout=120) == 130, "".join(seen) + rest
    assert "Traceback" not in rest and "Py4J" not in rest, rest
    # in a Spark job (most of the time) or between two (tests/integration/test_spark_ctrl_c.py holds
    # the first case in place)
    assert rest.strip().splitlines()[-1] in (
        "hvd-ctsm features: interrupted: Spark's running jobs were cancelled",
        "hvd-ctsm features: interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.both_stacks
def test_spark_starts_without_its_lines_of_no_news(tmp_path):
    """The feature job's first lines are its own: before, every start printed five of Spark's
    (the hostname's loopback address twice, "Setting default log level" and how to change it,
    the native-hadoop library's absence)."""
    done = subprocess.run([sys.executable, "-m", "hvd_ctsm", "features", "--source",
                           "synthetic:clients=50,items=20,events=500,seed=1", "--out",
                           str(tmp_path / "out"), "--split", "leave-last-out", "--row-groups",
                           "2"], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "SPARK_LOCAL_IP"})
    assert done.returncode == 0, done.stderr[-3000:]
    # Spark 4's JVM still says it uses an incubator module (no setting silences it)
    noise = [line for line in done.stderr.splitlines()
             if line != "WARNING: Using incubator modules: jdk.incubator.vector"]
    assert noise == [], noise
    assert done.stdout.startswith("features: reading and checking the events"), done.stdout
