"""Real Horovod workers: a 2-rank allreduce of rank-dependent tensors, over Gloo and over MPI."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_ctsm.distributed import parse_selftest

pytestmark = pytest.mark.horovod
HOROVODRUN = str(Path(sys.executable).with_name("horovodrun"))


@pytest.mark.parametrize("transport", ["gloo", "mpi"])
def test_allreduce_gives_the_exact_sum_on_both_ranks(transport):
    proc = subprocess.run(
        [HOROVODRUN, "-np", "2", f"--{transport}", sys.executable, "-m", "hvd_ctsm.distributed",
         "selftest"], capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    reports = parse_selftest(proc.stdout)
    assert sorted(r["rank"] for r in reports) == [0, 1]
    for r in reports:
        # rank r sends [0, 1, 2, 3] + 10 r: the sum over 2 ranks is [0, 2, 4, 6] + 10.
        assert r["sum"] == [10.0, 12.0, 14.0, 16.0] and r["size"] == 2


@pytest.mark.parametrize("mode", ["sleep", "spin"])
def test_a_rank_waiting_for_gradients_sleeps_unless_told_to_spin(mode):
    """Horovod's own wait spins: on CPU it would take a core from the rank still computing.
    synchronize_gradients(sleeping_wait=True) waits the same time on almost no CPU, and the
    gradients come back averaged either way."""
    worker = str(Path(__file__).parents[1] / "helpers" / "sync_wait_worker.py")
    proc = subprocess.run([HOROVODRUN, "-np", "2", "--gloo", sys.executable, worker, mode],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    reports = {r["rank"]: r for r in (json.loads(m) for m in
                                      re.findall(r"SYNCWAIT (\{[^{}]*\})", proc.stdout))}
    assert sorted(reports) == [0, 1]
    assert all(r["grad"] == [1.5] * 4 for r in reports.values())
    early = reports[0]
    assert early["wait_s"] > 0.3  # rank 0 did wait for the late rank
    cpu_share = early["wait_cpu_s"] / early["wait_s"]
    if mode == "sleep":
        assert cpu_share < 0.2, early
    else:
        assert cpu_share > 0.5, early
