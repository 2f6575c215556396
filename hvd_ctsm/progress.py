"""Progress lines for long commands (training off a terminal, backtest, scoring): plain lines on
stderr, every 30 s, that read the same in a terminal, a log file and a notebook's cell output."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
# A command that runs longer than this says how far it is, every this many seconds.
EVERY_S = 30.0


class Progress:
    """A count toward `total`, said in one line on stderr at most every `every_s` seconds: how
    many `unit` are done, the time so far and the time left at this run's pace, and the last
    values given to `set_postfix` (tqdm's names, so that it stands in for a bar)."""

    def __init__(self, total: int, what: str, unit: str, initial: int = 0,
                 every_s: float = EVERY_S):
        self.total, self.what, self.unit, self.every_s = total, what, unit, every_s
        self.done = self.first = initial  # a resumed run's pace counts its own steps only
        self.start = self.last = time.perf_counter()
        self.note = ""

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if now - self.last >= self.every_s:
            self.last = now
            print(self.line(now - self.start), file=sys.stderr, flush=True)

    def line(self, elapsed: float) -> str:
        left = elapsed / max(self.done - self.first, 1) * max(self.total - self.done, 0)
        return (f"{self.what}: {self.done:,} of {self.total:,} {self.unit}, {duration(elapsed)}, "
                f"about {duration(left)} left{self.note}")

    def set_postfix(self, **values) -> None:
        self.note = "; " + ", ".join(f"{name} {value}" for name, value in values.items())

    def close(self) -> None:
        pass


def duration(seconds: float) -> str:
    """42 s, 12 min, 2.5 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def with_progress(items: Iterable[T], total: int, what: str, unit: str,
                  size: Callable[[T], int] = lambda _: 1,
                  every_s: float = EVERY_S) -> Iterator[T]:
    """`items` as they come, counted (each `size(item)`) in a Progress line every `every_s`."""
    progress = Progress(total, what, unit, every_s=every_s)
    for item in items:
        yield item
        progress.update(size(item))
