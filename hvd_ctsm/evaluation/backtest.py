"""Backtest a trained model on held-out time, against popularity, and apply the deploy gate.

    python -m hvd_ctsm.evaluation.backtest --data DIR --model RUN --report RUN/backtest.json \
        --gate 'ndcg@10>=0.05' [--champion registry/current/backtest.json --tolerance 0.005]
        ... --champion models:/ctsm@champion     # the champion from the MLflow registry

Exit code 0 when the gate passes (or none is set), 1 when it refuses: a pipeline stops there.
Gate metrics name the full-ranking protocol by default (`ndcg@10`, `hr@10`, `mrr`); prefix with
`sampled.` or `sale.` for the others (`sampled.hr@10>=0.5`, `sale.auc>=0.6`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import operator
import re
import sys
import time
from pathlib import Path

import torch

from hvd_ctsm import tracking
from hvd_ctsm.data.batches import eval_batches, split_url
from hvd_ctsm.data.dataset_meta import DatasetMeta, check_same_vocabulary, read_metadata
from hvd_ctsm.evaluation.evaluate import Popularity, evaluate, model_scorer, paired_differences
from hvd_ctsm.files.atomic import atomic_write_bytes
from hvd_ctsm.model.checkpoint import load_state
from hvd_ctsm.model.ctsm import CTSM

OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
GATE = re.compile(r"^\s*([a-z_]+\.)?([a-z_]+(?:@\d+)?)\s*(>=|<=|>|<)\s*([0-9.eE+-]+)\s*$")


def model_file(path: str | Path) -> Path:
    path = Path(path)
    return path / "model.pt" if path.is_dir() else path


def load_model(path: str | Path) -> tuple[CTSM, dict]:
    state = load_state(model_file(path))
    return model_from_state(state), state


def model_from_state(state: dict) -> CTSM:
    """The CTSM saved in a model.pt state (as loaded by checkpoint.load_state), in eval mode."""
    return CTSM.from_checkpoint(state)


def parse_gate(text: str) -> list[tuple[str, str, str, float]]:
    rules = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = GATE.match(part)
        if not match:
            raise ValueError(f"gate {part!r}: expected e.g. 'ndcg@10>=0.05' or 'sampled.hr@10>0.5'")
        protocol = (match.group(1) or "full.").rstrip(".")
        if protocol not in ("full", "sampled", "sale"):
            raise ValueError(f"gate {part!r}: protocol must be full, sampled or sale")
        rules.append((protocol, match.group(2), match.group(3), float(match.group(4))))
    return rules


def apply_gate(metrics: dict, rules, champion: dict | None, tolerance: float) -> dict:
    checks = []
    for protocol, name, op, threshold in rules:
        value = metrics.get(protocol, {}).get(name)
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
    """The champion's report for the gate: a report file (REGISTRY/current/backtest.json), or
    models:/NAME@champion from the MLflow registry (the store of the model's run; None and a
    note when no version holds the alias yet: the first deploy has nothing to beat)."""
    if not ref:
        return None
    if not ref.startswith("models:/"):
        return json.loads(Path(ref).read_text())
    champion = tracking.champion_report(ref, model_file(model_path).parent)
    if champion is None:
        print(f"no model version holds {ref} yet: the champion rule is skipped")
    return champion


def evaluate_model(data: str, meta: DatasetMeta, model_path: str, split: str, seed: int):
    """One saved model's EvalResult on a split of `data` (whose vocabulary it must share)."""
    model, state = load_model(model_path)
    check_same_vocabulary(state, meta, model_path, data,
                          "backtest on the features it was trained on (or retrain)")
    batches = eval_batches(split_url(data, split), 0, 1, 256, meta.max_len)
    return evaluate(batches, model_scorer(model, torch.device("cpu")),
                    meta.num_items, seed=seed, keep_ranks=True)


def run_backtest(data: str, model_path: str, split: str = "test", seed: int = 0,
                 baseline: str | None = None) -> dict:
    """The model against popularity (and, given `baseline`, another trained model such as the
    SASRec-style `--config sasrec` run) on the same targets and sampled negatives."""
    t0 = time.perf_counter()
    meta = read_metadata(data)
    for name in ("train", split):  # a damaged or incomplete dataset stops before the model loads
        split_url(data, name)
    ours = evaluate_model(data, meta, model_path, split, seed)
    num_items, max_len = meta.num_items, meta.max_len
    url = split_url(data, split)
    counts = Popularity.fit(eval_batches(split_url(data, "train"), 0, 1, 256, max_len), num_items)
    popularity = evaluate(eval_batches(url, 0, 1, 256, max_len), counts.scorer(), num_items,
                          seed=seed, keep_ranks=True)
    others, compared = {}, {"popularity": popularity}
    if baseline:
        compared["baseline"] = evaluate_model(data, meta, baseline, split, seed)
        others = {"baseline": compared["baseline"].summary(),
                  "baseline_path": str(model_file(baseline))}
    # model - each other scorer, target by target: is a gap more than the clients' noise?
    differences = {name: paired_differences(ours, other, seed) for name, other in compared.items()}
    return {"split": split, "data": str(data), "model_path": str(model_file(model_path)),
            "model_sha256": hashlib.sha256(model_file(model_path).read_bytes()).hexdigest(),
            "model": ours.summary(), "popularity": popularity.summary(), **others,
            "differences": differences,
            "protocol": {"full": "all items, the client's earlier items removed",
                         "sampled": "target + 100 uniformly sampled items the client never had"},
            "seconds": round(time.perf_counter() - t0, 2)}


def print_table(report: dict) -> None:
    print(f"{'':14}{'NDCG@10':>10}{'HR@10':>10}{'MRR':>10}  (full) |{'NDCG@10':>10}{'HR@10':>10}"
          "  (sampled 100) |      AUC")
    for name in ("model", "baseline", "popularity"):
        if name not in report:
            continue
        m = report[name]
        sale = m.get("sale", {}).get("auc", float("nan"))
        print(f"{name:<14}{m['full']['ndcg@10']:>10.4f}{m['full']['hr@10']:>10.4f}"
              f"{m['full']['mrr']:>10.4f}         |{m['sampled']['ndcg@10']:>10.4f}"
              f"{m['sampled']['hr@10']:>10.4f}                |{sale:>9.4f}")
    for name, diffs in report.get("differences", {}).items():
        some = next(iter(diffs.values()))
        cells = [f"{key.split('.')[0]} NDCG@10 {d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"
                 for key, d in diffs.items() if key.endswith("ndcg@10")]
        print(f"model - {name} ({some['level']:.0%} interval over {some['groups']} clients): "
              + ", ".join(cells))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hvd_ctsm.evaluation.backtest",
                                description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="feature job output folder")
    p.add_argument("--model", required=True, help="run folder or model.pt")
    p.add_argument("--report", required=True, help="where the JSON report goes")
    p.add_argument("--split", default="test", choices=["test", "validation"])
    p.add_argument("--gate", default="", help="e.g. 'ndcg@10>=0.05,sampled.hr@10>=0.4'")
    p.add_argument("--champion", help="the deployed model's report, or models:/NAME@champion "
                                      "(MLflow registry): do not be worse than it")
    p.add_argument("--tolerance", type=float, default=0.005, help="allowed NDCG@10 drop")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled negatives")
    p.add_argument("--baseline", help="another run (e.g. trained with --config sasrec) to "
                                      "report beside the model on the same targets")
    args = p.parse_args(argv)
    rules = parse_gate(args.gate)  # a malformed gate fails before the slow part
    report = run_backtest(args.data, args.model, args.split, args.seed, args.baseline)
    champion = load_champion(args.champion, args.model)
    report["gate"] = apply_gate(report["model"], rules, champion, args.tolerance) \
        if (rules or champion) else {"passed": None, "checks": []}
    atomic_write_bytes(Path(args.report), json.dumps(report, indent=2).encode())
    tracking.log_report(model_file(args.model).parent, args.report, report, "backtest")
    print_table(report)
    for check in report["gate"]["checks"]:
        print(f"gate {'PASS' if check['passed'] else 'FAIL'}: {check['rule']} "
              f"(value {check['value']:.5f})")
    print(f"report: {args.report}")
    return 1 if report["gate"]["passed"] is False else 0

def cli() -> None:
    from hvd_ctsm.errors import run_cli

    sys.exit(run_cli(main, "hvd_ctsm.evaluation.backtest"))


if __name__ == "__main__":
    cli()
