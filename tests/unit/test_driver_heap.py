"""The feature job's local driver heap: chosen from the input's events, bounded by the machine,
and never over what the user or a running session already decided."""

from __future__ import annotations

import pytest

from spark_jobs import driver_heap
from spark_jobs.driver_heap import choose, estimated_events, local_heap_conf

GIB = 2**30


@pytest.mark.parametrize("events, machine_gib, gb, wanted", [
    (100_000, 24, 4, 4),  # MovieLens 100K: the default
    (10_000_000, 24, 4, 4),  # ran in 4g
    (30_000_000, 24, 10, 10),  # ran in 12g, and in this 10g (benchmarks/SCALE.md)
    (50_000_000, 24, 16, 16),  # ran in 16g, ran out of 4g
    (100_000_000, 24, 16, 32),  # more than 70% of the machine: capped, and said
    (50_000_000, 128, 16, 16),  # a bigger machine gives no more than the input wants
    (50_000_000, 4, 4, 16),  # never below the 4g every session gets
])
def test_the_heap_follows_the_events_up_to_a_share_of_the_machine(events, machine_gib, gb,
                                                                   wanted):
    choice = choose(events, machine_gib * GIB)
    assert (choice.gb, choice.wanted_gb) == (gb, wanted)
    said = choice.message(machine_gib)
    assert f"{gb}g" in said and "spark.driver.memory" in said
    assert ("run it on a cluster" in said) == (gb < wanted)


def test_a_synthetic_source_says_its_events_and_files_are_estimated_from_their_size(tmp_path):
    assert estimated_events("synthetic:clients=1000,items=10,events=50000000") == 50_000_000
    ratings = tmp_path / "ml" / "u.data"
    ratings.parent.mkdir()
    ratings.write_text("196\t242\t3\t881250949\n" * 1000)  # MovieLens' own line: 19 bytes
    assert 900 <= estimated_events(f"movielens:{ratings.parent}") <= 1000
    folder = tmp_path / "events"
    folder.mkdir()
    (folder / "part-0.parquet").write_bytes(b"x" * 8000)
    (folder / "part-1.csv").write_bytes(b"x" * 20000)
    assert estimated_events(f"events:{folder}") == 2000
    assert estimated_events(f"events:{tmp_path / 'missing'}") is None  # the job says it
    assert estimated_events("events:s3://bucket/events.parquet") is None
    assert estimated_events("table:sales.events") is None


def test_only_a_local_session_we_start_without_a_heap_of_its_own_gets_one(monkeypatch):
    monkeypatch.setattr(driver_heap, "machine_memory", lambda: 24 * GIB)
    big = "synthetic:clients=1000000,items=1000000,events=30000000"
    conf, said = local_heap_conf(big, "local[*]", {})
    assert conf == {"spark.driver.memory": "10g"} and "10g" in said
    assert local_heap_conf(big, "local[*]", {"spark.driver.memory": "2g"}) == ({}, None)
    assert local_heap_conf(big, "local[*]", {"spark_driver_memory": "2g"}) == ({}, None)
    assert local_heap_conf(big, "spark://127.0.0.1:7077", {}) == ({}, None)
    assert local_heap_conf(big, None, {}) == ({}, None)  # spark-submit started the JVM
    assert local_heap_conf("synthetic:events=20000", "local[2]", {}) == ({}, None)  # 4g: quiet
    assert local_heap_conf("synthetic:nonsense=1", "local[2]", {}) == ({}, None)  # job says it
