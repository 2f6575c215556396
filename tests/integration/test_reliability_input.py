"""Bad input to the trainer: bad config values, a rank with an empty shard, a slow rank.

Each is injected for real: main(argv) with the bad value, a real dataset with one row group for
two ranks, a real rank delayed (`debug.step_delay_s`, test-only) under horovodrun.
The unit-tier part is in tests/unit/test_reliability_input.py."""

import json
import shutil
import time

import pytest

from tests.helpers import faultlib as fl


@pytest.mark.horovod
@pytest.mark.spark
@pytest.mark.slow
def test_an_empty_shard_stops_every_rank_with_a_clear_error_no_hang(tiny_features, tmp_path):
    """Petastorm gives rank i the row groups i, i+size, ...: one row group for two ranks leaves
    rank 1 with nothing. Both ranks see it in the plan, before any collective, and stop."""
    data = tmp_path / "one-row-group"
    shutil.copytree(tiny_features, data)
    parts = sorted((data / "train").glob("part-*.parquet"))
    for extra in parts[1:]:
        extra.unlink()
    # As if built with --row-groups 1: the file listing says so (else the file check stops it).
    meta = json.loads((data / "metadata.json").read_text())
    meta["splits"]["train"]["files"] = meta["splits"]["train"]["files"][:1]
    (data / "metadata.json").write_text(json.dumps(meta))
    t0 = time.monotonic()
    proc = fl.run(fl.trainer_cmd(data, tmp_path / "run", np_=2), timeout=180, check=False)
    seconds = time.monotonic() - t0
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "has 1 row groups, fewer than 2 ranks" in text
    assert "rebuild it with --row-groups >= ranks" in text
    assert text.count("fewer than 2 ranks") >= 2  # every rank stopped, none left waiting
    fl.record("empty_shard_np2", stopped_after_seconds=round(seconds, 1))


@pytest.mark.horovod
@pytest.mark.spark
@pytest.mark.slow
def test_a_slow_rank_is_reported_by_rank_and_horovod_stalls_reach_our_log(tiny_features,
                                                                          tmp_path):
    out = tmp_path / "run"
    t0 = time.monotonic()
    # MPI controller: Horovod 0.28.1's Gloo controller printed no stall warnings here. Without
    # the response cache, Horovod reports a stalled gradient after one check interval.
    launcher = [fl.HOROVODRUN, "-np", "2", "--mpi"]
    proc = fl.run(fl.trainer_cmd(tiny_features, out, "--epochs", "1", "max_steps=4",
                                 'debug.step_delay_s={"1": 2.5}', launcher=launcher),
                  timeout=240, HOROVOD_STALL_CHECK_TIME_SECONDS="1",
                  HOROVOD_CACHE_CAPACITY="0")
    seconds = time.monotonic() - t0
    records = fl.read_jsonl(out / "train_log.jsonl")
    assert records and all(r["step_time"]["slowest_rank"] == 1 for r in records)
    assert all(r["step_time"]["slow_ranks"] == [1] for r in records)
    busy = records[-1]["step_time"]["busy_s_by_rank"]
    assert busy[1] > 2.5 > busy[0]  # rank 1 sleeps 2.5 s a step; rank 0 waits for it
    assert "slow rank(s) [1]" in proc.stderr + proc.stdout
    stalls = [e for e in fl.read_jsonl(out / "events.jsonl")
              if e["event"] == "horovod_stall_warning"]
    # Rank 1 named as the one missing (rank 0 may also be late once, reading at start-up).
    assert [e for e in stalls if e["missing_ranks"] == [1]]
    assert fl.summary(out)["steps"] == 4  # and it finished: no deadlock
    fl.record("slow_rank_np2", run_seconds=round(seconds, 1), stall_warnings=len(stalls),
              busy_s_by_rank=busy)
