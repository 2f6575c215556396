"""The deploy gate: its rules, and the step that applies them to an existing backtest report.

    python -m hvd_ctsm.evaluation.gate --report RUN/backtest.json --gate 'ndcg@10>=0.05' \
        [--champion REGISTRY --tolerance 0.005]  # the deployed version's report
    ... --champion models:/ctsm@champion      # the champion from the MLflow registry

The decision also goes to the model's MLflow run when it was tracked (hvd_ctsm.tracking).

The champion rule compares scores on the same test targets where it can
(hvd_ctsm.evaluation.champion): this step evaluates no model, so for a champion whose report was
measured on other data than this report's it decides as the backtest that wrote the report did,
and refuses (exit 2) one that backtest did not compare with, naming the fix: `hvd-ctsm backtest
... --champion`.

The decision is written into the report (its `gate` field, atomically), where
hvd_ctsm.serving.deploy reads it; `decide` is the one apply-write-print, shared by this step,
the backtest and the notebook API. Exit code 0 when the gate passes, 1 when it refuses (a DAG
stops there), 2 on a malformed gate, report or champion.
"""

from __future__ import annotations

import json
import math
import operator
import re
import sys
import tempfile
from pathlib import Path

from hvd_ctsm import tracking
from hvd_ctsm.errors import arg_parser, one_line
from hvd_ctsm.evaluation import champion
from hvd_ctsm.evaluation.metrics import RankingSums
from hvd_ctsm.files import outputs
from hvd_ctsm.files.atomic import atomic_write_bytes
from hvd_ctsm.files.storage import check_local, location
from hvd_ctsm.model.checkpoint import model_file

OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
# What a rule may name, by protocol: a report's metrics (hvd_ctsm.evaluation.backtest).
RANKING = [f"{metric}@{k}" for metric in ("ndcg", "hr") for k in RankingSums.ks] + ["mrr"]
METRICS = {"full": RANKING, "sampled": RANKING, "sale": ["auc", "log_loss"]}
CHAMPION_HELP = ("the deployed model: REGISTRY (its current version), a version folder, its "
                 "backtest report, or models:/NAME@champion (MLflow registry): do not be worse "
                 "than it on the same test targets (its report measured on other data: the "
                 "backtest evaluates its model on these targets where its vocabulary allows; "
                 "README, 'The champion rule')")
GATE_HELP = ("rules, e.g. 'ndcg@10>=0.05,sampled.hr@10>=0.4'; the metrics: [full.|sampled.]"
             f"{', '.join(RANKING)}; sale.auc, sale.log_loss")
TOLERANCE_HELP = ("allowed drop of full NDCG@10 below the champion's, a number >= 0 (default "
                  "0.005); used only with --champion, ignored without it")
GATE = re.compile(r"^\s*([a-z_]+\.)?([a-z_]+(?:@\d+)?)\s*(>=|<=|>|<)\s*([0-9.eE+-]+)\s*$")


def parse_gate(text: str) -> list[tuple[str, str, str, float]]:
    rules = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = GATE.match(part)
        if not match:
            raise ValueError(f"gate {part!r}: expected e.g. 'ndcg@10>=0.05' or 'sampled.hr@10>0.5'")
        protocol = (match.group(1) or "full.").rstrip(".")
        if protocol not in METRICS:
            raise ValueError(f"gate {part!r}: protocol must be full, sampled or sale")
        if match.group(2) not in METRICS[protocol]:
            raise ValueError(f"gate {part!r}: no metric {match.group(2)!r} in the {protocol} "
                             f"protocol; one of {', '.join(METRICS[protocol])}")
        rules.append((protocol, match.group(2), match.group(3), float(match.group(4))))
    return rules


def check_tolerance(tolerance: float) -> float:
    """--tolerance as the champion rule can use it: nan made every comparison fail ('gate FAIL
    ... - nan', exit 1, a refusal for bad input) and a negative one asks to beat the champion
    by that much, not to be allowed a drop. ValueError (exit 2) otherwise."""
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"--tolerance {tolerance}: must be a finite number >= 0, the NDCG@10 "
                         "drop allowed below the champion (e.g. 0.005, or 0 for none)")
    return tolerance


def apply_gate(metrics: dict, rules, champion: dict | None, tolerance: float) -> dict:
    """The decision on `metrics`: each rule, then, given `champion` (its metrics on the same
    targets as `model`, and a `record` of which: hvd_ctsm.evaluation.champion.rule_input), the
    champion rule on full.ndcg@10."""
    checks = []
    for protocol, name, op, threshold in rules:
        value = metrics.get(protocol, {}).get(name)
        why = metrics.get(protocol, {}).get(f"{name}_undefined")
        if why:
            raise ValueError(f"gate: {protocol}.{name} is undefined on this data ({why}); "
                             "drop that rule")
        if value is None:
            raise ValueError(f"gate: no metric {protocol}.{name} in the report")
        checks.append({"rule": f"{protocol}.{name}{op}{threshold}", "value": value,
                       "passed": bool(OPS[op](value, threshold))})
    if champion is not None:
        theirs = champion["model"]["full"]["ndcg@10"]
        ours = metrics["full"]["ndcg@10"]
        checks.append({"rule": f"full.ndcg@10 >= champion {theirs:.5f} - {tolerance}",
                       "value": ours, "passed": bool(ours >= theirs - tolerance)})
        if "record" in champion:  # which numbers the rule used (hvd_ctsm.evaluation.champion)
            checks[-1]["champion"] = champion["record"]
    return {"passed": all(c["passed"] for c in checks), "checks": checks}


def check_report_place(path: str | Path, fix: str = "write the report outside it (--report)"
                       ) -> None:
    """A report is written at a local path outside every model registry and feature dataset:
    `gate --report REGISTRY/v0001/backtest.json` recorded its decision in a deployed version."""
    check_local(path, "--report")
    outputs.check_not_inside_a_whole(path, fix=fix)


def check_report_path(path: str | Path) -> None:
    """A report is written where check_report_place allows, over an earlier report only: any
    other file there is refused (ValueError), before the backtest's work (it used to be
    replaced without a word)."""
    check_report_place(path)
    if not Path(path).exists():
        return
    try:
        earlier = read_report(path)
    except (OSError, ValueError):
        earlier = {}
    if "gate" not in earlier:  # every report the backtest writes holds its decision
        raise ValueError(f"refusing to replace {path}: it is not a backtest report; pick "
                         "another report path (--report)")


def read_report(path: str | Path) -> dict:
    """The backtest report at `path`; a folder, an empty or damaged file or another JSON file is
    one line naming it and the fix (json's "Expecting value: line 1 column 1 (char 0)" named
    neither). A missing file is FileNotFoundError: "PATH not found; check the path"."""
    path, report, why = Path(path), None, "JSON without a report's model field"
    if path.is_dir():
        why = "it is a folder"
    else:
        try:
            report = json.loads(path.read_bytes())
        except ValueError:  # not JSON, or not text at all (UnicodeDecodeError is a ValueError)
            why = "not JSON: empty or damaged"
    if isinstance(report, dict) and isinstance(report.get("model"), dict):
        return report
    raise ValueError(f"{path} is not a backtest report ({why}); pass the JSON file "
                     "`hvd-ctsm backtest --report` wrote")


def decide(report: dict, rules, champion: dict | None, tolerance: float,
           path: str | Path | None, step: str, echo: bool = True) -> bool | None:
    """Apply the gate to `report` (its `gate` field: passed None when there is no rule and no
    champion), write the report to `path` atomically, add it to the model's MLflow run, print
    each check; returns the decision."""
    report["gate"] = apply_gate(report["model"], rules, champion, tolerance) \
        if (rules or champion) else {"passed": None, "checks": []}
    if path:
        atomic_write_bytes(Path(path), json.dumps(report, indent=2).encode())
        tracking.log_report(model_file(report.get("model_path", ".")).parent, str(path), report,
                            step)
    for check in report["gate"]["checks"] if echo else ():
        print(f"gate {'PASS' if check['passed'] else 'FAIL'}: {check['rule']} "
              f"(value {check['value']:.5f})")
    return report["gate"]["passed"]


def read_champion(ref: str | None, report: dict, path: str) -> dict | None:
    """--champion's score on the report's targets, for the rule; a champion measured on other
    data is refused (this step evaluates no model: the backtest does)."""
    with tempfile.TemporaryDirectory(prefix="hvd_ctsm-champion-") as scratch:
        rival = champion.load(ref, Path(report.get("model_path", ".")).parent, scratch)
        return rival and champion.stored_for_gate(rival, report, path)


def main(argv: list[str] | None = None) -> int:
    p = arg_parser("hvd-ctsm gate", __doc__.splitlines()[0])
    p.add_argument("--report", type=location, required=True,
                   help="a report written by hvd-ctsm backtest; the decision is written into it, "
                        "replacing the one before, and deploy obeys it (a report in a model "
                        "registry is refused: a version never changes after deploy)")
    p.add_argument("--gate", default="", help=f"{GATE_HELP} (may be left out with --champion)")
    p.add_argument("--champion", type=location, help=CHAMPION_HELP)
    p.add_argument("--tolerance", type=float, default=0.005, help=TOLERANCE_HELP)
    args = p.parse_args(argv)
    try:
        check_tolerance(args.tolerance)
        rules = parse_gate(args.gate)
        check_report_place(args.report, "copy the report out of it and pass the copy "
                                        "(--report)")
        champion.check_ref(args.champion)
        report = read_report(args.report)
        theirs = read_champion(args.champion, report, args.report)
        if not rules and theirs is None:
            raise ValueError("the gate names no rule: pass --gate (e.g. 'ndcg@10>=0.05') or "
                             "--champion")
        apply_gate(report["model"], rules, theirs, args.tolerance)  # bad report: exit 2
    except (ValueError, KeyError, OSError) as exc:
        print(f"hvd-ctsm gate: error: {one_line(exc)}", file=sys.stderr)
        return 2
    return 0 if decide(report, rules, theirs, args.tolerance, args.report, "gate") else 1


if __name__ == "__main__":
    sys.exit(main())
