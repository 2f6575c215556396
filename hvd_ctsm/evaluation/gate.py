"""The deploy gate as its own step: apply rules to an existing backtest report.

    python -m hvd_ctsm.evaluation.gate --report RUN/backtest.json --gate 'ndcg@10>=0.05' \
        [--champion registry/current/backtest.json --tolerance 0.005]
    ... --champion models:/ctsm@champion      # the champion from the MLflow registry

The decision also goes to the model's MLflow run when it was tracked (hvd_ctsm.tracking).

The decision is written into the report (its `gate` field, atomically), where
hvd_ctsm.serving.deploy
reads it. Exit code 0 when the gate passes, 1 when it refuses (a DAG stops there), 2 on a
malformed gate or report.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hvd_ctsm import tracking
from hvd_ctsm.evaluation.backtest import apply_gate, load_champion, parse_gate
from hvd_ctsm.files.atomic import atomic_write_bytes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hvd_ctsm.evaluation.gate",
                                description=__doc__.splitlines()[0])
    p.add_argument("--report", required=True, help="a report written by "
                                                       "hvd_ctsm.evaluation.backtest")
    p.add_argument("--gate", required=True, help="e.g. 'ndcg@10>=0.05,sampled.hr@10>=0.4'")
    p.add_argument("--champion", help="the deployed model's report, or models:/NAME@champion "
                                      "(MLflow registry): do not be worse than it")
    p.add_argument("--tolerance", type=float, default=0.005, help="allowed NDCG@10 drop")
    args = p.parse_args(argv)
    try:
        rules = parse_gate(args.gate)
        report = json.loads(Path(args.report).read_text())
        champion = load_champion(args.champion, Path(report.get("model_path", ".")).parent)
        if not rules and champion is None:
            raise ValueError("the gate names no rule (e.g. 'ndcg@10>=0.05')")
        report["gate"] = apply_gate(report["model"], rules, champion, args.tolerance)
    except (ValueError, KeyError, OSError) as exc:
        print(f"hvd_ctsm.evaluation.gate: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    atomic_write_bytes(Path(args.report), json.dumps(report, indent=2).encode())
    tracking.log_report(Path(report.get("model_path", ".")).parent, args.report, report, "gate")
    for check in report["gate"]["checks"]:
        print(f"gate {'PASS' if check['passed'] else 'FAIL'}: {check['rule']} "
              f"(value {check['value']:.5f})")
    return 0 if report["gate"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
