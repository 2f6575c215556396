"""Early-stopping patience replayed on logged validation curves: which epoch each trial would
have kept, and where it would have stopped, had it waited for fewer validations.

    python benchmarks/patience.py                  # every logged trial that stopped early
    python benchmarks/patience.py --data short     # one dataset's

A trial's training up to a stop does not depend on the patience (the lr schedule is set by
`epochs`, not by when training stops), so a curve logged with patience P shows exactly what any
patience up to P would have kept: the same model, or an earlier one. The curves are the log's
rounded values (4 digits), so two validations that differ in the 5th digit count as a tie here.
Writes results/patience.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.model_search import LOG  # noqa: E402

OUT = LOG.parent / "patience.md"
PATIENCES = (1, 2, 3, 4, 5)


def replay(curve: list, patience: int) -> tuple[int, int, float, float]:
    """(epoch stopped at, epoch kept, its full and sampled NDCG@10) with `patience`
    validations in a row without a better full NDCG@10."""
    best, since = 0, 0
    for i, (_, full, _) in enumerate(curve):
        if full > curve[best][1]:
            best, since = i, 0
        elif i:
            since += 1
            if since >= patience:
                return curve[i][0], *curve[best]
    return curve[-1][0], *curve[best]


def logged_patience(record: dict) -> int:
    return (record.get("config") or {}).get("early_stop_evals", 5)


def rows(records: list[dict]) -> list[str]:
    lines = ["| data | trial | seed | logged | " + " | ".join(
        f"patience {p}: stop (kept) full / sampled" for p in PATIENCES) + " |",
        "|---|---|---|---|" + "---|" * len(PATIENCES)]
    for r in records:
        logged = logged_patience(r)
        cells = []
        for p in PATIENCES:
            if p > logged:
                cells.append("-")  # the curve cannot tell what waiting longer would have kept
                continue
            stop, kept, full, sampled = replay(r["val_curve"], p)
            cells.append(f"{stop} ({kept}) {full:.4f} / {sampled:.4f}")
        lines.append(f"| {r['data']} | {r['trial']} | {r['seed']} | {r['epochs_run']} "
                     f"({r['best_epoch']}), patience {logged} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="only this dataset's trials (default: all)")
    p.add_argument("--log", type=Path, default=LOG)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    records = [json.loads(line) for line in args.log.read_text().splitlines() if line.strip()]
    chosen = [r for r in records if r.get("val_curve") and logged_patience(r)
              and args.data in (None, r["data"])
              and r["epochs_run"] < (r.get("config") or {}).get("epochs", 100)]
    text = "\n".join([
        "# Early-stopping patience replayed on the logged validation curves",
        "", "Each trial's curve, cut where a shorter patience would have stopped it "
        "(benchmarks/patience.py): the epoch it stops at, the epoch it keeps (the best "
        "full NDCG@10 so far) and that epoch's validation full / sampled NDCG@10. Trials "
        "that trained all their epochs are left out (nothing stopped them); '-': the trial "
        "waited for fewer validations than that.", "", *rows(chosen)]) + "\n"
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
