"""keep_freed_memory: a process that allocates and frees the same large tensor again and again
stops faulting fresh pages in for it (counted by the kernel, not timed)."""

import json
import subprocess
import sys

import pytest

from hvd_ctsm.train.cpu_memory import glibc

# Each run in a fresh process: the setting cannot be undone in the process that made it.
ALLOCATE_AND_FREE = """
import json, resource, sys
import torch
from hvd_ctsm.train.cpu_memory import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
for _ in range(10):  # the heap grows to its peak first (glibc places the first few apart)
    torch.ones(40 * 2**20 // 4).sum()  # 40 MB: above glibc's largest mmap threshold (32 MB)
faults = []
for _ in range(20):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(40 * 2**20 // 4).sum()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "faults": faults}))
"""


def faults_per_tensor(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", ALLOCATE_AND_FREE, mode], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.skipif(glibc() is None, reason="mallopt is glibc's; elsewhere nothing is changed")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    default, kept = faults_per_tensor("default"), faults_per_tensor("keep")
    assert kept["kept"] is True
    # 40 MB is 10,240 pages of 4 KB: by default every tensor faults (nearly) all of them in.
    assert all(count > 5000 for count in default["faults"]), default
    # Kept, a tensor reuses the pages the last one freed. Under load (CI runs tests side by side)
    # an allocation of another thread can once move the top of the heap, and that one tensor
    # faults in fresh pages (CI once measured 512 a tensor over 20: one tensor's 10,240 pages).
    reused = [count for count in kept["faults"] if count < 100]
    assert len(reused) >= 18, kept
