"""The deploy gate: its rules, and the step that applies them to an existing backtest report.

    python -m hvd_ctsm.evaluation.gate --report RUN/backtest.json --gate 'ndcg@10>=0.05' \
        [--champion REGISTRY --tolerance 0.005]  # the deployed version's report
    ... --champion models:/ctsm@champion      # the champion from the MLflow registry

The decision also goes to the model's MLflow run when it was tracked (hvd_ctsm.tracking).

The decision is written into the report (its `gate` field, atomically), where
hvd_ctsm.serving.deploy reads it; `decide` is the one apply-write-print, shared by this step,
the backtest and the notebook API. Exit code 0 when the gate passes, 1 when it refuses (a DAG
stops there), 2 on a malformed gate or report.
"""

from __future__ import annotations

import json
import operator
import re
import sys
from pathlib import Path

from hvd_ctsm import tracking
from hvd_ctsm.errors import arg_parser, one_line
from hvd_ctsm.evaluation.metrics import RankingSums
from hvd_ctsm.files.atomic import atomic_write_bytes
from hvd_ctsm.files.storage import is_remote, location
from hvd_ctsm.model.checkpoint import model_file

OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
# What a rule may name, by protocol: a report's metrics (hvd_ctsm.evaluation.backtest).
RANKING = [f"{metric}@{k}" for metric in ("ndcg", "hr") for k in RankingSums.ks] + ["mrr"]
METRICS = {"full": RANKING, "sampled": RANKING, "sale": ["auc", "log_loss"]}
CHAMPION_HELP = ("the deployed model: REGISTRY (its current version's report), a report file, "
                 "or models:/NAME@champion (MLflow registry): do not be worse than it")
CHAMPION_TAKES = ("--champion takes a registry folder (its current version), a version folder "
                  "(REGISTRY/vNNNN), a backtest report (.json) or models:/NAME@ALIAS")
GATE_HELP = ("rules, e.g. 'ndcg@10>=0.05,sampled.hr@10>=0.4'; the metrics: [full.|sampled.]"
             f"{', '.join(RANKING)}; sale.auc, sale.log_loss")
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


def apply_gate(metrics: dict, rules, champion: dict | None, tolerance: float) -> dict:
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
    return {"passed": all(c["passed"] for c in checks), "checks": checks}


def load_champion(ref: str | None, model_path: str | Path) -> dict | None:
    """The champion's report for the gate: the folder registry's (REGISTRY: its current
    version's backtest.json), a version folder's, a report file, or models:/NAME@champion from
    the MLflow registry (the store of the model's run; None and a note when no version holds
    the alias yet: the first deploy has nothing to beat)."""
    if not ref:
        return None
    if ref.startswith("models:/"):
        champion = tracking.champion_report(ref, model_file(model_path).parent)
        if champion is None:
            print(f"no model version holds {ref} yet: the champion rule is skipped")
        return champion
    path = Path(ref)
    if not path.is_dir():
        return read_report(path, ref)
    report = model_file(path).parent / "backtest.json"
    if not report.is_file():
        raise ValueError(f"--champion {ref}: no deployed version's report there ({report} not "
                         "found): name a registry deploy wrote to, or leave --champion out "
                         "until the first deploy")
    return read_report(report, ref)


def read_report(path: Path, ref: str) -> dict:
    """The report --champion names; anything else (a model.pt, another JSON) is one line saying
    what --champion takes (a model.pt was "'utf-8' codec can't decode byte 0x80")."""
    try:
        report = json.loads(path.read_bytes())
    except ValueError:  # not JSON, or not text at all (UnicodeDecodeError is a ValueError)
        report = None
    if not (isinstance(report, dict) and isinstance(report.get("model"), dict)):
        hint = (f" (for the model deployed there, name its folder {path.parent})"
                if (path.parent / "backtest.json").is_file() else "")
        raise ValueError(f"--champion {ref}: not a backtest report{hint}; {CHAMPION_TAKES}")
    return report


def check_report_path(path: str | Path) -> None:
    """A report is written over an earlier report only: any other file there is refused
    (ValueError), before the backtest's work (it used to be replaced without a word)."""
    if is_remote(path) or not Path(path).exists():
        return
    try:
        earlier = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        earlier = None
    if not (isinstance(earlier, dict) and {"model", "gate"} <= earlier.keys()):
        raise ValueError(f"refusing to replace {path}: it is not a backtest report; pick "
                         "another report path (--report)")


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


def main(argv: list[str] | None = None) -> int:
    p = arg_parser("hvd-ctsm gate", __doc__.splitlines()[0])
    p.add_argument("--report", type=location, required=True,
                   help="a report written by hvd-ctsm backtest; the decision is written into it, "
                        "replacing the one before, and deploy obeys it")
    p.add_argument("--gate", default="", help=f"{GATE_HELP} (may be left out with --champion)")
    p.add_argument("--champion", help=CHAMPION_HELP)
    p.add_argument("--tolerance", type=float, default=0.005, help="allowed NDCG@10 drop")
    args = p.parse_args(argv)
    try:
        rules = parse_gate(args.gate)
        report = json.loads(Path(args.report).read_text())
        champion = load_champion(args.champion, Path(report.get("model_path", ".")).parent)
        if not rules and champion is None:
            raise ValueError("the gate names no rule: pass --gate (e.g. 'ndcg@10>=0.05') or "
                             "--champion")
        apply_gate(report["model"], rules, champion, args.tolerance)  # bad report: exit 2
    except (ValueError, KeyError, OSError) as exc:
        print(f"hvd-ctsm gate: error: {one_line(exc)}", file=sys.stderr)
        return 2
    return 0 if decide(report, rules, champion, args.tolerance, args.report, "gate") else 1


if __name__ == "__main__":
    sys.exit(main())
