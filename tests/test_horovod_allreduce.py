"""Real Horovod workers: a 2-rank allreduce of rank-dependent tensors, over Gloo and over MPI."""

import os
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
