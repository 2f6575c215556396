"""Quality report: CTSM (the default config) vs the SASRec-style baseline vs popularity.

    python benchmarks/quality_report.py --ml100k DIR --run      # train every missing cell, report
    python benchmarks/quality_report.py                          # the report from the log only
    python benchmarks/quality_report.py --run --only short       # one dataset's missing cells
    python benchmarks/quality_report.py --quick --out DIR        # smoke run: tiny data, one seed

A full run trains up to 42 cells of 10-30 minutes each on 2 cores (hours): cells already in the
log are reused, so it can be stopped and started again.

Cells: {ML-100K with input-order ties, ML-100K with strict ties, the synthetic set, short purchase
histories (synthetic), the same with weaker sequences, weaker still, ML-100K's users cut into short
purchase histories} x {CTSM with no overrides,
`--config sasrec`} x seeds 0, 1, 2, each trained under `horovodrun -np 2` by model_search.run_trial
and backtested on the test split (the saved model is the best validated one). A logged trial counts
for a cell when its resolved trainer config, read back through today's config classes, equals the
cell's (so results survive added settings whose defaults keep the old behaviour, and never count
after a default changed); trials go to the model search's log (results/model_search.jsonl), so its
trials of the same settings count too. An 'auto' setting counts as what it picks on the data:
model.loss by the catalog's size, optim.item_weight_decay by the training split's targets per
item (read from the built features, else from results/dataset_facts.json, which --run keeps).
The report gives, per cell, the median and [min-max] over seeds of full and sampled NDCG@10/HR@10,
the train minutes, and the time to quality (the kept epoch and the minutes to it), with popularity
beside them, and the seeds it has.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ml100k_windows, model_search  # noqa: E402
from benchmarks.common import (ML100K, RESULTS, SHORT_HARD, SHORT_HISTORIES,  # noqa: E402
                               SHORT_WEAK, SYNTHETIC, run, spread, work_folder)

DATASETS = {  # name: (source with {ml100k}, feature job options)
    "ml-input-order": ("movielens:{ml100k}", ["--ties", "input-order"]),
    "ml-strict": ("movielens:{ml100k}", []),
    # "synth2": the sale label since it depends more strongly on taste and series (P_PURCHASE_* in
    # spark_jobs.synthetic); the log's "synth" trials trained on the earlier label.
    "synth2": (SYNTHETIC, []),
    # Issue 44's stand-in for a shop's purchase log: about 9 events a client, a 10k-item catalog
    # every item of which appears (a long sparse tail), purchases only (no ratings to label).
    "short": (SHORT_HISTORIES, []),
    "short-hard": (SHORT_HARD, []),  # the same, with weaker sequences
    "short-weak": (SHORT_WEAK, []),  # weaker still: the last items say little about the next
    # Real behaviour in that shape: ML-100K's users cut into windows of about 9 purchases
    # (benchmarks/ml100k_windows.py, written into the work folder at run time).
    "ml-short": ("events:{ml_short}", []),
}
ML100K_ITEMS = 1682  # MovieLens 100K's catalog (its README)
MODELS = {"ctsm": [], "sasrec": ["--config", "sasrec"]}
COMMON = ["dist.threads_per_rank=1"]  # two ranks on two cores: one thread each
SEEDS, RANKS = (0, 1, 2), 2
QUICK = {"datasets": {"tiny": ("synthetic:clients=120,items=40,events=3000,seed=1", [])},
         "overrides": ["epochs=4", "eval_every_epochs=2", "model.dim=32", "model.layers=1",
                       "data.batch_size=16"],
         "seeds": (0,)}


def cell_args(model: str, extra: list[str]) -> list[str]:
    return [*MODELS[model], *COMMON, *extra]


def catalog_items(data: str) -> int | None:
    """A dataset's catalog size (at most), read from its source: it resolves model.loss=auto
    when cells and logged trials are compared. None for a dataset not in DATASETS."""
    from spark_jobs.synthetic import SyntheticParams

    source = DATASETS.get(data, ("",))[0]
    if source.startswith("movielens:") or "{ml_short}" in source:
        return ML100K_ITEMS
    if source.startswith("synthetic:"):
        return SyntheticParams.parse(source.partition(":")[2]).items
    return None


def targets_per_item(features: Path) -> float | None:
    """The training split's targets per catalog item of a built dataset (None: not built
    here), which resolves optim.item_weight_decay=auto when cells and trials are compared."""
    from hvd_ctsm.data.dataset_meta import read_metadata

    if not (features / "metadata.json").exists():
        return None
    return read_metadata(features).train_targets_per_item


def known_targets_per_item(datasets: dict, work: Path, facts: Path) -> dict[str, float | None]:
    """Each dataset's targets per item: from its features where built (under `work`, or an
    existing dataset's folder), else as `facts` (results/dataset_facts.json) recorded them when
    it was built, so that the report alone, from the log, resolves 'auto' settings too."""
    recorded = _recorded(facts)
    per_item = {}
    for name, (source, options) in datasets.items():
        built = targets_per_item(Path(source) if options is None else work / "features" / name)
        per_item[name] = built if built is not None else recorded.get(name, {}).get(
            "train_targets_per_item")
    return per_item


def record_targets_per_item(facts: Path, per_item: dict[str, float | None]) -> None:
    """Add the datasets' known targets per item to `facts`, keeping the others (atomically)."""
    from hvd_ctsm.files.atomic import atomic_write_bytes

    merged = _recorded(facts) | {name: {"train_targets_per_item": value}
                                 for name, value in per_item.items() if value is not None}
    atomic_write_bytes(facts, (json.dumps(merged, indent=1, sort_keys=True) + "\n").encode())


def _recorded(facts: Path) -> dict:
    return json.loads(facts.read_text()) if facts.exists() else {}


def cell_fingerprint(data: str, args: list[str], per_item: float | None = None) -> str:
    return model_search.config_fingerprint(args, catalog_items(data), per_item)


def matching(records: list[dict], data: str, fingerprint: str, seeds,
             per_item: float | None = None) -> dict[int, dict]:
    """The newest logged trial per seed of `seeds` for (data, fingerprint) at RANKS ranks
    (other seeds logged for other purposes stay out of the report)."""
    found = {}
    for r in records:
        if (r["data"] == data and r["ranks"] == RANKS and r["seed"] in seeds
                and model_search.record_fingerprint(r, catalog_items(data), per_item)
                == fingerprint):
            found[r["seed"]] = r
    return found


def build_dataset(name: str, source: str, options: list[str] | None, root: Path,
                  ml100k: Path) -> Path:
    if options is None:  # an existing dataset
        return Path(source)
    out = root / name
    if not (out / "metadata.json").exists():
        ml_short = root / "ml-short-events.csv"
        if "{ml_short}" in source and not ml_short.exists():
            print(f"[quality] {name}: {ml100k_windows.write_events(ml100k, ml_short)}")
        run([sys.executable, "-m", "spark_jobs.build_features", "--source",
             source.format(ml100k=ml100k, ml_short=ml_short), "--out", str(out), "--split",
             "leave-last-out", "--master", "local[2]", "--overwrite", *options],
            root / f"{name}.log", timeout=3600)
    return out


def run_missing(datasets: dict, extra: list[str], seeds, root: Path, ml100k: Path,
                log: Path) -> dict[str, float | None]:
    """Train the cells the log lacks; return each dataset's targets per item."""
    per_item = {}
    for data, (source, options) in datasets.items():
        path = build_dataset(data, source, options, root / "features", ml100k)
        per_item[data] = targets_per_item(path)
        for model in MODELS:
            args = cell_args(model, extra)
            have = matching(read_log(log), data, cell_fingerprint(data, args, per_item[data]),
                            seeds, per_item[data])
            for seed in (s for s in seeds if s not in have):
                print(f"[quality] {data} {model} seed {seed} ...", flush=True)
                record = model_search.run_trial(path, root / "runs", f"{data}-{model}", args,
                                                RANKS, seed)
                with open(log, "a") as f:
                    f.write(json.dumps(record) + "\n")
    return per_item


def read_log(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def report(records: list[dict], datasets: dict, extra: list[str], seeds,
           per_item: dict[str, float | None] | None = None) -> str:
    lines = ["# Quality: CTSM vs the SASRec-style baseline vs popularity", "",
             f"Test split, leave-last-out, {RANKS} ranks; each model is the best validated "
             "epoch's. Median [min-max] over the seeds measured; a cell with fewer than "
             f"{len(seeds)} seeds says so. Machines: MACHINES.", "",
             "| data | model | seeds | full NDCG@10 | full HR@10 | sampled NDCG@10 | "
             "sampled HR@10 | sale AUC | train minutes | best epoch | minutes to it |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    machines = set()  # the cells' own: a cell's seeds may have run on different machines
    for data in datasets:
        popularity = None
        for model in MODELS:
            known = (per_item or {}).get(data)
            fingerprint = cell_fingerprint(data, cell_args(model, extra), known)
            rs = list(matching(records, data, fingerprint, seeds, known).values())
            machines |= {r.get("machine", "not recorded") for r in rs}
            if not rs:
                lines.append(f"| {data} | {model} | 0 of {len(seeds)} | not measured"
                             + " |" * 8)
                continue
            popularity = rs[0]["test"]
            cells = [_cell(rs, k) for k in ("ndcg@10", "hr@10", "sampled_ndcg@10",
                                            "sampled_hr@10", "sale_auc")]
            minutes = spread(r["seconds"] / 60 for r in rs)["median"]
            # Time to quality: an epoch's mean wall time (validations included) up to the kept one
            best = spread(r["best_epoch"] for r in rs)["median"]
            to_best = spread(r["seconds_per_epoch"] * r["best_epoch"] / 60 for r in rs)["median"]
            lines.append(f"| {data} | {model} | {len(rs)} of {len(seeds)} | {' | '.join(cells)} "
                         f"| {minutes:.1f} | {best:g} | {to_best:.1f} |")
        if popularity:
            sale = popularity.get("popularity_sale_auc")
            lines.append(f"| {data} | popularity | - | {popularity['popularity_ndcg@10']:.4f} |  "
                         f"| {popularity['popularity_sampled_ndcg@10']:.4f} |  "
                         f"| {'-' if sale is None else f'{sale:.4f}'} | 0 | | |")
    lines[2] = lines[2].replace("MACHINES", "; ".join(sorted(machines)) or "none yet")
    return "\n".join(lines) + "\n"


def _cell(records: list[dict], key: str) -> str:
    values = [r["test"].get(key) for r in records]
    if any(v is None for v in values):  # the SASRec baseline has no sale head
        return "-"
    s = spread(values)
    return f"{s['median']:.4f} [{s['min']:.4f}-{s['max']:.4f}]"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ml100k", type=Path, default=ML100K)
    p.add_argument("--run", action="store_true", help="train the cells the log lacks")
    p.add_argument("--quick", action="store_true", help="tiny synthetic data, one seed")
    p.add_argument("--data", type=Path, help="with --quick: an existing tiny dataset to use")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--work", type=Path, default=Path("runs/quality"))
    p.add_argument("--only", help="with --run: these datasets only (comma-separated names of "
                   f"{', '.join(DATASETS)}); the report still shows every one")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    datasets, extra, seeds = DATASETS, [], SEEDS
    to_run = datasets
    if args.quick:
        datasets, extra, seeds = QUICK["datasets"], QUICK["overrides"], QUICK["seeds"]
        if args.data:
            datasets = {args.data.name: (str(args.data), None)}
        to_run = datasets
    elif args.only:
        names = args.only.split(",")
        if set(names) - set(DATASETS):
            p.error(f"--only: unknown {sorted(set(names) - set(DATASETS))}; "
                    f"known: {', '.join(DATASETS)}")
        to_run = {name: DATASETS[name] for name in names}
    # Every trial goes to the model search's log: its trials count here when their configs match.
    log = args.out / "quality_report_quick.jsonl" if args.quick else model_search.LOG
    facts = args.out / "dataset_facts.json"
    per_item = known_targets_per_item(datasets, args.work, facts)
    if args.run or args.quick:
        with work_folder(prefix="bench-quality-") as tmp:
            work = Path(tmp) if args.quick else args.work
            per_item |= run_missing(to_run, extra, seeds, work, args.ml100k, log)
        record_targets_per_item(facts, per_item)
    text = report(read_log(log), datasets, extra, seeds, per_item)
    (args.out / ("quality_report_quick.md" if args.quick else "quality_report.md")).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
