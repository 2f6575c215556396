"""The GPU check (scripts/gpu_check.sh, benchmarks/gpu.py) runs only where a GPU is, never in CI.
Here: its stored results render, and on a machine without a GPU it says so in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks import gpu, gpu_parity
from tests.conftest import REPO


@pytest.mark.parametrize("name", ["gpu.json", "gpu_2026-11-30.json"])
def test_the_stored_gpu_results_render(name):
    payload = json.loads((REPO / "benchmarks/results" / name).read_text())
    lines = gpu.render(payload)
    assert any(line.startswith("| 1,000,000 | shared |") for line in lines)
    assert sum(line.startswith(("| bf16 |", "| off |")) for line in lines) >= 2
    parity = [line for line in lines if line.startswith(tuple(f"| {c} |" for c in
                                                               gpu_parity.CHECKS))]
    assert len(parity) == len(payload.get("parity", []))  # none before 2026-11-30


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_the_check_says_so_and_exits_2(tmp_path):
    proc = subprocess.run(["bash", str(REPO / "scripts/gpu_check.sh"), str(tmp_path),
                           str(tmp_path / "out")], capture_output=True, text=True,
                          env=os.environ | {"PYTHON": sys.executable})
    assert proc.returncode == 2, proc.stderr
    assert "no CUDA device here" in proc.stderr
