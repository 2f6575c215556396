"""Backtest a trained model on held-out time, against popularity, and apply the deploy gate.

    python -m hvd_ctsm.evaluation.backtest --data DIR --model RUN --report RUN/backtest.json \
        --gate 'ndcg@10>=0.05' [--champion REGISTRY --tolerance 0.005]
        ... --champion models:/ctsm@champion     # the champion from the MLflow registry

Exit code 0 when the gate passes (or none is set), 1 when it refuses: a pipeline stops there.
The champion rule compares on these targets (hvd_ctsm.evaluation.champion): a champion whose
report was measured on other data has its model evaluated here too, and one line says so.
Gate metrics name the full-ranking protocol by default (`ndcg@10`, `hr@10`, `mrr`); prefix with
`sampled.` or `sale.` for the others (`sampled.hr@10>=0.5`, `sale.auc>=0.6`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from hvd_ctsm.data.batches import eval_batches
from hvd_ctsm.data.dataset import Dataset
from hvd_ctsm.data.dataset_meta import metadata_sha256, read_metadata
from hvd_ctsm.errors import arg_parser
from hvd_ctsm.evaluation import champion, gate
from hvd_ctsm.evaluation.evaluate import Popularity, evaluate, model_scorer, paired_differences
from hvd_ctsm.files.storage import check_local, location
from hvd_ctsm.model.checkpoint import load_model, model_file, model_sha256
from hvd_ctsm.progress import with_progress

EVALUATED_SPLITS = ("test", "validation")  # the serving split has no targets


def split_batches(dataset: Dataset, split: str, what: str) -> Iterator[dict]:
    """The split's evaluation batches (256 clients each), with progress lines."""
    rows = int(dataset.meta.splits.get(split, {}).get("rows", 0))
    return with_progress(eval_batches(dataset.split(split), 0, 1, 256, dataset.meta.max_len),
                         rows, f"backtest: {what}", "clients ranked",
                         size=lambda batch: len(batch["client_id"]))


FIX = {"model": "backtest on the features it was trained on (or retrain)",
       "baseline": "backtest on the features it was trained on (or retrain it)",
       "champion": "as --champion it cannot be evaluated on these targets, and its report's "
                   "score is from other targets: gate with --gate rules instead of --champion, "
                   "or backtest on features built with its vocabulary (features --previous-vocab "
                   "its vocab.json, while no item is new)"}


def checked_model(dataset: Dataset, model_path: str | Path, role: str):
    """A saved model, refused in one line unless it indexes items as the dataset does."""
    model, state = load_model(model_path)
    dataset.check_model(state, str(model_file(model_path)), FIX[role])
    return model


def evaluate_model(dataset: Dataset, model, split: str, seed: int, what: str):
    """One loaded model's EvalResult on a split of the dataset."""
    batches = split_batches(dataset, split, what)
    return evaluate(batches, model_scorer(model, torch.device("cpu")),
                    dataset.meta.num_items, seed=seed, keep_ranks=True)


def run_backtest(data: str, model_path: str, split: str = "test", seed: int = 0,
                 baseline: str | None = None, champion: str | Path | None = None) -> dict:
    """The model against popularity (and, given `baseline`, another trained model such as the
    SASRec-style `--config sasrec` run; given `champion`, the deployed model's file) on the same
    targets and sampled negatives. Every model is loaded and checked before the first runs."""
    if split not in EVALUATED_SPLITS:
        raise ValueError(f"split must be one of {', '.join(EVALUATED_SPLITS)}, got {split!r}")
    t0 = time.perf_counter()
    dataset = Dataset.open(data)
    for name in ("train", split):  # a damaged or incomplete dataset stops before the model loads
        dataset.split(name)
    # Each model's file, once: a registry's `current` moved by a deploy during the backtest
    # made the report name (and hash) another version than the one evaluated.
    paths = {role: model_file(path) for role, path in
             (("model", model_path), ("baseline", baseline), ("champion", champion)) if path}
    models = {role: checked_model(dataset, path, role) for role, path in paths.items()}
    ours = evaluate_model(dataset, models.pop("model"), split, seed, "model")
    num_items, max_len = dataset.meta.num_items, dataset.meta.max_len
    counts = Popularity.fit(eval_batches(dataset.split("train"), 0, 1, 256, max_len), num_items)
    popularity = evaluate(split_batches(dataset, split, "popularity"), counts.scorer(),
                          num_items, seed=seed, keep_ranks=True)
    others, compared = {}, {"popularity": popularity}
    for role in list(models):
        compared[role] = evaluate_model(dataset, models.pop(role), split, seed, role)
        others |= {role: compared[role].summary(), f"{role}_path": str(paths[role]),
                   f"{role}_sha256": model_sha256(paths[role])}
    # model - each other scorer, target by target: is a gap more than the clients' noise?
    differences = {name: paired_differences(ours, other, seed) for name, other in compared.items()}
    return {"split": split, "data": str(data), "data_sha256": metadata_sha256(dataset.meta),
            "model_path": str(paths["model"]), "model_sha256": model_sha256(paths["model"]),
            "model": ours.summary(), "popularity": popularity.summary(), **others,
            "differences": differences,
            "protocol": {"full": "all items, the client's earlier items removed",
                         "sampled": "target + 100 uniformly sampled items the client never had"},
            "seconds": round(time.perf_counter() - t0, 2)}


def print_table(report: dict) -> None:
    print(f"{'':14}{'NDCG@10':>10}{'HR@10':>10}{'MRR':>10}  (full) |{'NDCG@10':>10}{'HR@10':>10}"
          "  (sampled 100) |      AUC")
    for name in ("model", "baseline", "champion", "popularity"):
        if name not in report:
            continue
        m = report[name]
        sale = m.get("sale", {}).get("auc")
        print(f"{name:<14}{m['full']['ndcg@10']:>10.4f}{m['full']['hr@10']:>10.4f}"
              f"{m['full']['mrr']:>10.4f}         |{m['sampled']['ndcg@10']:>10.4f}"
              f"{m['sampled']['hr@10']:>10.4f}                |"
              + (f"{sale:>9.4f}" if sale is not None else f"{'n/a':>9}"))
    if "auc_undefined" in report["model"].get("sale", {}):
        print(f"AUC n/a: {report['model']['sale']['auc_undefined']}")
    for name, diffs in report.get("differences", {}).items():
        some = next(iter(diffs.values()))
        cells = [f"{key.split('.')[0]} NDCG@10 {d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"
                 for key, d in diffs.items() if key.endswith("ndcg@10")]
        print(f"model - {name} ({some['level']:.0%} interval over {some['groups']} clients): "
              + ", ".join(cells))


def seed(text: str) -> int:
    """--seed as numpy's generators take it: -1 was "expected non-negative integer", alone."""
    value = int(text)  # argparse names the option for a ValueError: "invalid seed value"
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative: a seed is a whole number >= 0")
    return value


def main(argv: list[str] | None = None) -> int:
    p = arg_parser("hvd-ctsm backtest", __doc__.splitlines()[0])
    p.add_argument("--data", type=location, required=True, help="feature job output folder")
    p.add_argument("--model", type=location, required=True, help="run folder or model.pt")
    p.add_argument("--report", type=location, required=True, help="where the JSON report goes")
    p.add_argument("--split", default="test", choices=EVALUATED_SPLITS)
    p.add_argument("--gate", default="", help=gate.GATE_HELP)
    p.add_argument("--champion", type=location, help=gate.CHAMPION_HELP)
    p.add_argument("--tolerance", type=float, default=0.005, help=gate.TOLERANCE_HELP)
    p.add_argument("--seed", type=seed, default=0, help="seed of the sampled negatives (>= 0)")
    p.add_argument("--baseline", type=location,
                   help="another run (e.g. trained with --config sasrec) to report beside the "
                        "model on the same targets")
    args = p.parse_args(argv)
    for option in ("model", "report", "baseline"):  # the data alone may be at a URL
        if getattr(args, option):
            check_local(getattr(args, option), f"--{option}")
    champion.check_ref(args.champion)
    # A bad tolerance, gate, champion or --report fails first, before the backtest's work.
    gate.check_tolerance(args.tolerance)
    rules = gate.parse_gate(args.gate)
    with tempfile.TemporaryDirectory(prefix="hvd_ctsm-champion-") as scratch:
        rival = champion.load(args.champion, args.model, scratch)
        gate.check_report_path(args.report)
        here = {"data": str(args.data), "split": args.split,
                "data_sha256": metadata_sha256(read_metadata(args.data))}
        same, rival_model = champion.model_to_evaluate(rival, here) if rival else (None, None)
        report = run_backtest(args.data, args.model, args.split, args.seed, args.baseline,
                              rival_model)
    print_table(report)
    rule = rival and champion.rule_input(rival, report, same)
    if rival:
        champion.say_measured(rival, report, same)
    passed = gate.decide(report, rules, rule, args.tolerance, args.report, "backtest")
    print(f"report: {args.report}")
    return 1 if passed is False else 0


def cli() -> None:
    from hvd_ctsm.errors import run_cli

    sys.exit(run_cli(main, "hvd-ctsm backtest"))


if __name__ == "__main__":
    cli()
