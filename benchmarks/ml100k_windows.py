"""Short purchase histories from real behaviour: MovieLens 100K's ratings, each user's cut in
time order into windows of about 9 events, each window a client of its own (issue 44's shape:
short histories, purchases only, no ratings). Written at run time into a benchmark's work folder:
MovieLens's license forbids a copy of its data, or of data derived from it, in the project.

A window is 2 events plus a geometric count with mean MEAN_EVENTS - 2 (seeded, so the same on
every run); a user's last window shorter than 2 events is dropped and counted. Every client is
one user's consecutive ratings, so it holds real sequential taste, but the windows of one user
are separate clients: a later window's events are training data when an earlier window's last
one is tested, as other users' later events are under leave-last-out anyway.
"""

from __future__ import annotations

import csv
import io
import random
from collections import defaultdict
from pathlib import Path

from hvd_ctsm.files.atomic import atomic_write_bytes

MEAN_EVENTS = 9
SEED = 7


def window_lengths(rng: random.Random, mean: int = MEAN_EVENTS):
    """Endless window lengths: 2 plus a geometric count with mean `mean` - 2."""
    stop = 1 / (mean - 1)
    while True:
        length = 2
        while rng.random() > stop:
            length += 1
        yield length


def windows(events: list[tuple[int, int, str]], lengths) -> list[list[tuple[int, int, str]]]:
    """One user's events (timestamp, line number, item) cut in time order (ties in the file's
    order) into consecutive windows of the given lengths; a last one under 2 events is left out."""
    ordered, cut, start = sorted(events), [], 0
    while start < len(ordered):
        length = next(lengths)
        cut.append(ordered[start:start + length])
        start += length
    return [w for w in cut if len(w) >= 2]


def write_events(ml100k: Path, out: Path, mean: int = MEAN_EVENTS, seed: int = SEED) -> dict:
    """Write the windows as an events CSV (the feature job's `events:` source) to `out`; return
    the counts (ratings read, events written, clients, ratings left out)."""
    by_user = defaultdict(list)
    with open(Path(ml100k) / "u.data") as f:
        for line_number, line in enumerate(f):
            user, item, _rating, timestamp = line.split()
            by_user[user].append((int(timestamp), line_number, item))
    lengths, written, clients = window_lengths(random.Random(seed), mean), 0, 0
    text = io.StringIO()
    rows = csv.writer(text, lineterminator="\n")
    rows.writerow(["client_id", "item_id", "timestamp", "event_type", "value"])
    for user in sorted(by_user, key=int):
        for k, window in enumerate(windows(by_user[user], lengths)):
            rows.writerows([f"u{user}w{k}", item, ts, "purchase", ""] for ts, _, item in window)
            written, clients = written + len(window), clients + 1
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, text.getvalue().encode())
    read = sum(len(events) for events in by_user.values())
    return {"ratings": read, "events": written, "clients": clients, "left_out": read - written}
