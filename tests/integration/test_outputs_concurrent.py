"""Two jobs writing the same output folder at once, as overlapping runs of one scheduled command
do: real processes around the real hvd_ctsm.files.outputs.staged (the feature job's, the Spark
scorer's and the estimator's), each writing a small file where the feature job runs Spark."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO)}  # the checkout's hvd_ctsm, from any folder
WRITERS = ["a", "b", "c", "d"]  # more at once: more of the ways two of them can collide


def write_together(out: Path, overwrite: bool, names: list[str],
                   times: int = 1) -> list[tuple[int, str]]:
    """One writer per name, each released at once when every one has started, each writing
    `times` times: each one's (exit code, stderr)."""
    start = out.parent / "start"
    start.mkdir(exist_ok=True)
    go = start / "go"
    mode = "overwrite" if overwrite else "new"
    procs = [subprocess.Popen([sys.executable, str(REPO / "tests/helpers/staged_writer.py"),
                               str(go), str(out), mode, name, str(times)], cwd=REPO, env=ENV,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for name in names]
    deadline = time.monotonic() + 120
    while len(list(start.glob("ready-*"))) < len(procs) and time.monotonic() < deadline:
        time.sleep(0.01)  # their imports
    go.touch()
    ended = [(proc.wait(timeout=120), proc.stderr.read()) for proc in procs]
    for proc in procs:
        proc.stderr.close()
    for file in start.iterdir():
        file.unlink()
    return ended


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.glob(f".{out.name}.*"))


@pytest.mark.slow
@pytest.mark.faults
def test_jobs_into_one_new_out_one_publishes_and_the_others_are_refused(tmp_path):
    """Before: both exited 0, the later replacing the other's output without --overwrite; or
    the later crashed (exit 3, "Directory not empty") and left its stage."""
    for round_ in range(6):
        out = tmp_path / f"out-{round_}"
        ended = write_together(out, False, WRITERS)
        codes = [code for code, _ in ended]
        assert sorted(codes) == [0] + [2] * (len(WRITERS) - 1), f"round {round_}: {ended}"
        for code, err in ended:  # refused at its publish, or (started late) at its start
            assert code == 0 or (err.count("\n") == 1 and (
                "was written by another job while this one ran" in err
                or "exists; pass --overwrite to replace it" in err)), err
        winner = WRITERS[codes.index(0)]
        assert (out / "job").read_text() == winner
        assert leftovers(out) == []


@pytest.mark.slow
@pytest.mark.faults
def test_jobs_with_overwrite_all_publish_whole_and_leave_nothing_behind(tmp_path):
    """Before: one of them sometimes failed: a crash (exit 3, "Directory not empty"), its stage
    left beside OUT, or "OUT not found" (exit 2) when the other had just moved OUT aside."""
    out = tmp_path / "out"
    for round_ in range(6):
        ended = write_together(out, True, WRITERS, times=40)  # collisions are rarer here
        assert [code for code, _ in ended] == [0] * len(WRITERS), f"round {round_}: {ended}"
        assert (out / "job").read_text() in WRITERS
        assert leftovers(out) == []
