"""The quality report's short histories from MovieLens's ratings (benchmarks/ml100k_windows.py),
on a u.data written here: every rating is an event of exactly one window or counted as left
out, each window is one user's consecutive ratings in time order, and the cut is the same on
every run."""

import csv
import random
import statistics

from benchmarks import ml100k_windows


def write_ratings(folder, users: int, per_user: int) -> list[tuple[str, str, int]]:
    rng, ratings = random.Random(3), []
    for user in range(1, users + 1):
        for _ in range(per_user):  # timestamps shuffled and often equal: ties by file order
            ratings.append((str(user), str(rng.randrange(1, 500)), rng.randrange(1000, 1100)))
    rng.shuffle(ratings)
    (folder / "u.data").write_text("".join(f"{u}\t{i}\t4\t{t}\n" for u, i, t in ratings))
    return ratings


def read_events(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_every_rating_is_one_windows_event_in_time_order_or_counted_left_out(tmp_path):
    ratings = write_ratings(tmp_path, users=40, per_user=120)
    counts = ml100k_windows.write_events(tmp_path, tmp_path / "events.csv")
    events = read_events(tmp_path / "events.csv")
    assert counts["ratings"] == len(ratings) == counts["events"] + counts["left_out"]
    assert len(events) == counts["events"] and counts["left_out"] <= 40  # one short tail a user
    clients: dict[str, list[dict]] = {}
    for event in events:
        clients.setdefault(event["client_id"], []).append(event)
        assert event["event_type"] == "purchase" and event["value"] == ""
    assert len(clients) == counts["clients"]
    for user in map(str, range(1, 41)):  # a user's windows, one after another, are its ratings
        mine = [e for c, es in clients.items() if c.startswith(f"u{user}w") for e in es]
        order = sorted(((t, n) for n, (u, _, t) in enumerate(ratings) if u == user))
        assert [int(e["timestamp"]) for e in mine] == [t for t, _ in order][:len(mine)]
    lengths = [len(es) for es in clients.values()]
    assert min(lengths) >= 2 and 7 <= statistics.mean(lengths) <= 11


def test_the_same_ratings_give_the_same_windows(tmp_path):
    write_ratings(tmp_path, users=5, per_user=50)
    ml100k_windows.write_events(tmp_path, tmp_path / "a.csv")
    ml100k_windows.write_events(tmp_path, tmp_path / "b.csv")
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "b.csv", "u.data"]
