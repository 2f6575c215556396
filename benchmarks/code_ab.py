"""Two revisions of the code side by side: the same training steps from another checkout (an
older revision's worktree) and from this one, in turn, round after round.

    git worktree add ../before HEAD~1
    python benchmarks/code_ab.py --before ../before --data DATASET [--data DATASET2] \\
        --engines single,torch --steps 16 --rounds 3 --name in_place_exclusion

Each round runs every dataset and engine from both checkouts, `before` first in the even rounds
and this one first in the odd rounds (the real trainer, one thread a rank, as
benchmarks/scale.py's train cells). Per cell: seconds a step (the median over rounds of each
run's median), its phases, peak RSS per rank, this revision's time over the other's, and whether
the two ended with the same parameters (the trainer's checksums; a change meant to keep the
numbers keeps them to the bit). Trainer overrides after `--` go to both. Writes
results/code_ab_NAME.json with both commits (a section of RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO, RESULTS, commit_of, save, work_folder  # noqa: E402
from benchmarks.scale import repeated, train_cell  # noqa: E402

ENGINES = {"single": 1, "torch": 2, "horovod": 2}


def compare(before: list[dict], this: list[dict]) -> dict:
    """One cell's rounds from each revision: their medians, the ratio, and whether every run of
    both ended with the same parameters."""
    checksums = {c for run in before + this for c in run["parameter_checksums"]}
    a, b = repeated(before), repeated(this)
    return {"before": a, "this": b,
            "this_over_before": b["seconds_per_step"] / a["seconds_per_step"],
            "round_ratios": [t["seconds_per_step"] / o["seconds_per_step"]
                             for o, t in zip(before, this, strict=True)],
            "same_parameters": len(checksums) == 1}


def sides_in_round(round_number: int, before: Path, this: Path) -> list[tuple[str, Path]]:
    """(side, checkout) in the order they run in this round: `before` first in the even rounds,
    this checkout first in the odd ones (ABBA). A side that always ran first read 1.14x where
    an ABBA run by hand read 0.96x (2026-11-29, one process, 10^6 items)."""
    sides = [("before", before), ("this", this)]
    return sides if round_number % 2 == 0 else sides[::-1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, type=Path,
                   help="the other revision's checkout (e.g. a git worktree)")
    p.add_argument("--data", required=True, type=Path, action="append",
                   help="a built dataset (repeatable)")
    p.add_argument("--engines", default="single,torch",
                   help="single (one process), torch and horovod (np=2 each)")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--name", default="change", help="results code_ab_NAME.json")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("trainer", nargs="*", help="trainer overrides for both, after --")
    args = p.parse_args(argv)
    before = args.before.resolve()
    if not (before / "hvd_ctsm" / "train").is_dir():
        raise SystemExit(f"code_ab: {before} holds no hvd_ctsm checkout: give --before a "
                         "worktree of the revision to compare with")
    engines = args.engines.split(",")
    unknown = set(engines) - set(ENGINES)
    if unknown:
        raise SystemExit(f"code_ab: unknown engine(s) {sorted(unknown)}: use {sorted(ENGINES)}")
    overrides = ["dist.threads_per_rank=1", *args.trainer]
    runs: dict[tuple, dict[str, list[dict]]] = {}
    with work_folder("hvd_ctsm-code-ab-") as work:
        for round_number in range(args.rounds):
            sides = sides_in_round(round_number, before, REPO)
            for data in args.data:
                for engine in engines:
                    cell = runs.setdefault((str(data), engine), {"before": [], "this": []})
                    # Each side from its own folder: `python -m` imports the working
                    # directory's package before PYTHONPATH's.
                    for side, checkout in sides:
                        run = train_cell(data.resolve(), work, engine, ENGINES[engine],
                                         args.steps, overrides, checkout=checkout)
                        cell[side].append(run)
                        print(f"[code_ab] {data.name} {engine} {side}: "
                              f"{run['seconds_per_step']:.3f} s/step", flush=True)
    cells = [{"data": shown(Path(data)), "items": items_of(Path(data)), "engine": engine,
              **compare(sides["before"], sides["this"])} for (data, engine), sides in runs.items()]
    payload = {"before_commit": commit_of(before), "this_commit": commit_of(REPO),
               "steps": args.steps, "rounds": args.rounds, "order": "abba", "trainer": overrides,
               "cells": cells}
    path = save(f"code_ab_{args.name}", payload, args.out)
    print("\n".join(render(payload)))
    print(f"[code_ab] wrote {path}")
    return 0


def shown(data: Path) -> str:
    """The dataset as the results file names it: relative to the checkout, else its name (no
    machine's paths in a results file)."""
    try:
        return str(data.resolve().relative_to(REPO))
    except ValueError:
        return data.name


def items_of(data: Path) -> int:
    return json.loads((data / "metadata.json").read_text())["vocab"]["items"]


def render(p: dict) -> list[str]:
    """RESULTS.md's section for one results file (benchmarks/report.py)."""
    # Files written before 2026-11-30 ran `before` first in every round.
    order = " (ABBA)" if p.get("order") == "abba" else " (before first)"
    out = [f"`{p['before_commit']}` (before) against `{p['this_commit']}` (this), {p['steps']} "
           f"steps a run, {p['rounds']} rounds in turn{order}, `{' '.join(p['trainer'])}`; s/step "
           "medians:", "",
           "| data | items | run | before | this | this / before | per round | same parameters |",
           "| --- | ---: | --- | ---: | ---: | ---: | --- | --- |"]
    for c in p["cells"]:
        rounds = ", ".join(f"{r:.2f}" for r in c["round_ratios"])
        items = f"{c['items']:,}" if "items" in c else "-"
        out.append(f"| {Path(c['data']).name} | {items} | {c['engine']} | "
                   f"{c['before']['seconds_per_step']:.3f} | {c['this']['seconds_per_step']:.3f} "
                   f"| {c['this_over_before']:.2f}x | {rounds} | "
                   f"{'yes' if c['same_parameters'] else 'no'} |")
    return [*out, ""]


if __name__ == "__main__":
    sys.exit(main())
