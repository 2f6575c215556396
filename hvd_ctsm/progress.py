"""Progress lines for long commands (backtest, scoring): plain lines on stderr, every 30 s, that
read the same in a terminal, a log file and a notebook's cell output."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
# A command that runs longer than this says how far it is, every this many seconds.
EVERY_S = 30.0


def with_progress(items: Iterable[T], total: int, what: str, unit: str,
                  size: Callable[[T], int] = lambda _: 1,
                  every_s: float = EVERY_S) -> Iterator[T]:
    """`items` as they come; every `every_s` seconds one line on stderr: how many `unit` of
    `total` are done (each item counts `size(item)`) and the time left at that pace."""
    start = last = time.perf_counter()
    done = 0
    for item in items:
        yield item
        done += size(item)
        now = time.perf_counter()
        if now - last >= every_s:
            last = now
            left = (now - start) / done * max(total - done, 0)
            print(f"{what}: {done:,} of {total:,} {unit}, {now - start:.0f} s, about {left:.0f} s "
                  "left", file=sys.stderr, flush=True)
