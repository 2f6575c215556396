"""Keep the memory a CPU training process frees for its next step, instead of giving it back.

A training step allocates and frees the same large tensors every step: the full-softmax logits
alone are targets x items x 4 bytes (about 40 MB for a batch of 64 MovieLens clients), and the
softmax, its gradient and the masks are as large. glibc's malloc serves every block above its
mmap threshold (which never exceeds 32 MB) with fresh pages from the kernel and returns them on
free, so each step pays the kernel to map and zero them again: on ML-100K, 220,000 page faults
per second per rank, and a sixth (whole runs) to a third (mid-training) of each rank's CPU time
spent in the kernel. With mmap off and trimming off, freed blocks stay in the process's heap
and the next step reuses them.

On ML-100K epochs took 0.76x the time at np=1 and 0.80x at np=2 (benchmarks/PERFORMANCE.md). The
price is memory: the process keeps its peak heap until it exits, as GPU caching allocators do
(one epoch at np=1: peak 1,269 MB against 1,110 MB).
"""

from __future__ import annotations

import ctypes
import platform
import sys

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
NEVER_TRIM = 2**31 - 1  # mallopt takes an int: the largest top of heap kept rather than trimmed


def glibc() -> ctypes.CDLL | None:
    """This process's C library when it is glibc on Linux (the only one with these knobs)."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(None)


def keep_freed_memory() -> bool:
    """Stop glibc from returning freed memory to the kernel, from now on, in this process.
    True when set; False where the C library is not glibc (nothing changed)."""
    libc = glibc()
    if libc is None:
        return False
    # Without mmap, large blocks come from the heap (or, should the heap not grow, from mmap
    # anyway: glibc falls back to it), and a freed one is reused for the next request.
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
