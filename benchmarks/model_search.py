"""Model search: train named trainer settings on a dataset, one after another, and keep a table.

    python benchmarks/model_search.py --data FEATURES --tag ml-io --trial NAME=OVERRIDES ...
    python benchmarks/model_search.py --table           # results/model_search.md from the log

A trial is a name and trainer overrides separated by spaces (`gated=model.block=gated epochs=40`),
optionally run on several ranks (`--ranks 2`) and seeds (`--seeds 0,1,2`). Every trial appends one
JSON line per (trial, seed) to results/model_search.jsonl (or `--log`): the validation curve
(NDCG@10 per validated epoch), the best validation epoch and metrics, wall time per epoch, and the
test metrics of the saved model (the best validated one). Settings are chosen on the validation
columns only; the test columns are what a chosen setting then reports.

Trials run under horovodrun by default, or under torchrun (`--launcher torchrun`, where Horovod
is missing: a GPU machine); `--jobs N` runs N trials at once (on one GPU, whose small steps leave
it mostly idle), and `--timeout S` stops a trial after S seconds and still backtests the model it
kept so far (the record says `stopped`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (NO_TRACKING, RESULTS, horovodrun, machine, run_until,  # noqa: E402
                               spread, torchrun)

LOG = RESULTS / "model_search.jsonl"
TABLE = RESULTS / "model_search.md"


# Settings that do not change what is learned (paths, logging, tracking) or that trials vary.
VOLATILE = {"out", "seed", "progress", "keep_checkpoints", "log_every_steps", "commit_every_steps",
            "tracking", "debug"}


def config_fingerprint(trainer_args: list[str], items: int | None = None,
                       targets_per_item: float | None = None) -> str:
    """A cell's identity: its resolved config (today's defaults filled in), less VOLATILE;
    `items`, the catalog size where known, resolves model.loss=auto, and `targets_per_item`,
    the training split's where known, optim.item_weight_decay=auto (_fingerprint)."""
    from hvd_ctsm.config import config_from_argv, to_dict

    cfg, _ = config_from_argv(["--data", "_", *trainer_args])
    return _fingerprint(to_dict(cfg), items, targets_per_item)


def saved_config(run_folder: Path) -> dict | None:
    """The config a finished run saved (config.yaml), as logged with its trial; the dataset
    path is kept as its folder name (the record's `data`), so that no machine's paths go into
    the committed log (cells never compare data.path: _fingerprint)."""
    import yaml

    saved = run_folder / "config.yaml"
    if not saved.exists():
        return None
    config = yaml.safe_load(saved.read_text())
    config["data"]["path"] = Path(config["data"]["path"]).name
    config["out"] = Path(config["out"]).name
    return config


def record_fingerprint(record: dict, items: int | None = None,
                       targets_per_item: float | None = None) -> str | None:
    """The fingerprint of a logged trial's config read through today's config classes, so that
    settings added since do not tell apart trials that trained the same model; None
    when the record has no config or today's classes refuse it (a setting was removed)."""
    from hvd_ctsm.config import LEGACY_OPTIM, ConfigError, TrainConfig, from_dict, to_dict
    from hvd_ctsm.config.model_config import LEGACY_ARCH

    if not record.get("config"):
        return None
    # A model setting the record predates is filled in as the behaviour it trained with (what
    # ModelConfig.from_saved does for an old model.pt), not as today's default, which may differ.
    config = dict(record["config"])
    config["model"] = LEGACY_ARCH | config.get("model", {})
    config["optim"] = LEGACY_OPTIM | config.get("optim", {})
    try:
        return _fingerprint(to_dict(from_dict(TrainConfig, config)), items, targets_per_item)
    except (ConfigError, TypeError, ValueError):
        return None


def _fingerprint(values: dict, items: int | None = None,
                 targets_per_item: float | None = None) -> str:
    from hvd_ctsm.model.heads import resolve_loss
    from hvd_ctsm.train.support import resolve_item_weight_decay

    values = {k: v for k, v in values.items() if k not in VOLATILE}
    values["data"] = {k: v for k, v in values["data"].items() if k != "path"}
    if items is not None:
        # 'auto' counts as the loss it picks on that catalog: trials logged with 'full' before
        # 'auto' existed (or after, by name) trained the same model where it picks 'full'.
        model = values["model"] = dict(values["model"])
        model["loss"] = resolve_loss(model["loss"], items, model["future_targets"],
                                     model["uniform_bce_weight"])
    if targets_per_item is not None:
        # likewise 'auto' decay counts as what it gives on that data (a run saves it resolved)
        optim = values["optim"] = dict(values["optim"])
        optim["item_weight_decay"] = resolve_item_weight_decay(optim["item_weight_decay"],
                                                               targets_per_item)
    if values["model"]["loss"] not in ("shared", "auto"):
        # only the shared loss draws them: a full-softmax trial is the same whatever they were
        values["model"] = {k: v for k, v in values["model"].items() if k != "shared_negatives"}
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def validation_curve(out: Path) -> list[dict]:
    if not (out / "metrics.jsonl").exists():
        return []
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def run_trial(data: Path, work: Path, name: str, overrides: list[str], ranks: int,
              seed: int, data_name: str | None = None, launcher: str = "horovodrun",
              timeout: float = 7200) -> dict:
    out = work / f"{name}-s{seed}"
    args = ["-m", "hvd_ctsm.train", "--data", str(data), "--out", str(out), "--overwrite",
            "progress=false", "keep_checkpoints=1", f"seed={seed}", NO_TRACKING, *overrides]
    launch = torchrun if launcher == "torchrun" else horovodrun
    seconds, stopped = run_until(launch(ranks, args), work / f"{name}-s{seed}.log",
                                 timeout)
    summary_file = out / "train_summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    curve = validation_curve(out)
    if not curve:
        when = f"stopped after {timeout:.0f} s" if stopped else "ended"
        raise RuntimeError(f"{when} before its first validation: nothing to backtest")
    if stopped:
        model_from_checkpoint(out, data)
    best = max(curve, key=lambda r: r["full"]["ndcg@10"])
    report = backtest(data, out, work / f"{name}-s{seed}-backtest.log")
    epochs = curve[-1]["epoch"]
    record = {
        "trial": name, "seed": seed, "ranks": ranks, "overrides": overrides,
        "config": saved_config(out),
        "data": data_name or data.name, "epochs_run": epochs, "seconds": round(seconds, 1),
        "seconds_per_epoch": round(seconds / max(epochs, 1), 2),
        "best_epoch": best["epoch"], "model_epoch": summary.get("model_epoch", best["epoch"]),
        "val": {"ndcg@10": best["full"]["ndcg@10"], "hr@10": best["full"]["hr@10"],
                "sampled_ndcg@10": best["sampled"]["ndcg@10"],
                "sale_auc": best.get("sale", {}).get("auc")},
        "val_curve": [(r["epoch"], round(r["full"]["ndcg@10"], 4),
                       round(r["sampled"]["ndcg@10"], 4)) for r in curve],
        "test": {"ndcg@10": report["model"]["full"]["ndcg@10"],
                 "hr@10": report["model"]["full"]["hr@10"],
                 "sampled_ndcg@10": report["model"]["sampled"]["ndcg@10"],
                 "sampled_hr@10": report["model"]["sampled"]["hr@10"],
                 "sale_auc": report["model"].get("sale", {}).get("auc"),
                 "popularity_ndcg@10": report["popularity"]["full"]["ndcg@10"],
                 "popularity_sampled_ndcg@10": report["popularity"]["sampled"]["ndcg@10"],
                 "popularity_sale_auc": report["popularity"].get("sale", {}).get("auc")},
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine_label(),
    }
    if launcher != "horovodrun":
        record["launcher"] = launcher
    if stopped:  # the model kept is the best validated one before the stop
        record["stopped"] = f"after {timeout:.0f} s, at epoch {epochs}"
    return record


def model_from_checkpoint(run_folder: Path, data: Path) -> None:
    """A stopped trial's model.pt: its best validated checkpoint's weights, saved as the trainer
    saves the model it keeps (Trainer.finish), so that the real backtest reads it."""
    from hvd_ctsm.config import TrainConfig, from_dict
    from hvd_ctsm.data.dataset import Dataset
    from hvd_ctsm.model.checkpoint import load_state
    from hvd_ctsm.train.loop import checkpoint_weights
    from hvd_ctsm.train.support import build_model_sizes
    from hvd_ctsm.train.trainer import save_model

    state = load_state(run_folder / "checkpoints" / "best.pt")
    cfg = from_dict(TrainConfig, state["config"])
    sizes = build_model_sizes(Dataset.open(str(data)), cfg.model.item_category,
                              cfg.model.item_tags)
    save_model(run_folder / "model.pt", checkpoint_weights(state), sizes, state["config"],
               state["vocab_sha256"])


def backtest(data: Path, run_folder: Path, log: Path) -> dict:
    """The test-split backtest of a run's kept model (the real CLI), as its JSON report."""
    report = run_folder / "test_report.json"
    cmd = [sys.executable, "-m", "hvd_ctsm", "backtest", "--data", str(data), "--model",
           str(run_folder), "--report", str(report), "--seed", "0"]
    run_until(cmd, log, timeout=3600)
    return json.loads(report.read_text())


def machine_label() -> str:
    """The CPU and cores, and the GPU where the trainer would use one."""
    label = f"{machine().get('cpu', '?')}, {machine().get('cores', '?')} cores"
    import torch

    if torch.cuda.is_available():
        label += f", {torch.cuda.get_device_name(0)}"
    return label


def render(records: list[dict]) -> str:
    head = ("| data | trial | ranks | seed | epochs (best) | s/epoch | val NDCG@10 | val sampled | "
            "test NDCG@10 | test HR@10 | test sampled NDCG@10 | sale AUC (pop.) | overrides |")
    lines = [
        "# Model search: every trial, in the order run",
        "",
        f"Machines: {'; '.join(sorted({r.get('machine', '?') for r in records}))}, shared with "
        "other work while these ran (seconds are indicative only). Settings are chosen on "
        "the validation columns; the test columns are reported, never used to choose.",
    ]
    lines += ["", "## Summary over seeds (test split of the saved, best validated model; a seed "
              "run again counts by its latest run)", "",
              *summary_rows(records), "", "## Every trial", "", head,
              "|" + "---|" * (head.count("|") - 1)]
    for r in records:
        t, v = r["test"], r["val"]
        sale = "" if t["sale_auc"] is None else (
            f"{t['sale_auc']:.3f} ({t['popularity_sale_auc']:.3f})")
        lines.append(
            f"| {r['data']} | {r['trial']} | {r['ranks']} | {r['seed']} | {r['epochs_run']} "
            f"({r['best_epoch']}) | {r['seconds_per_epoch']} | {v['ndcg@10']:.4f} | "
            f"{v['sampled_ndcg@10']:.4f} | {t['ndcg@10']:.4f} | {t['hr@10']:.4f} | "
            f"{t['sampled_ndcg@10']:.4f} | {sale} | `{' '.join(r['overrides'])}` |")
    return "\n".join(lines) + "\n"


def summary_rows(records: list[dict]) -> list[str]:
    """One row per (data, trial, ranks): validation metrics (what settings are chosen on) and
    test metrics as the median and [min-max] over seeds, and the training wall time, so a
    comparison says whether it exceeds the seeds' spread. A seed run again counts once, by
    its latest record (the per-seed table keeps every run)."""
    latest = {(r["data"], r["trial"], r["ranks"], r["seed"]): r for r in records}
    groups: dict[tuple, list[dict]] = {}
    for r in latest.values():
        groups.setdefault((r["data"], r["trial"], r["ranks"]), []).append(r)

    def cell(rs, part, key):
        s = spread(r[part][key] for r in rs)
        return f"{s['median']:.4f} [{s['min']:.4f}-{s['max']:.4f}]"

    lines = ["| data | trial | ranks | seeds | val NDCG@10 | val sampled NDCG@10 | test NDCG@10 | "
             "test sampled NDCG@10 | popularity NDCG@10 / sampled | train minutes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (data, trial, ranks), rs in groups.items():
        pop = rs[0]["test"]
        minutes = spread(r["seconds"] / 60 for r in rs)["median"]
        lines.append(f"| {data} | {trial} | {ranks} | {len(rs)} | {cell(rs, 'val', 'ndcg@10')} | "
                     f"{cell(rs, 'val', 'sampled_ndcg@10')} | {cell(rs, 'test', 'ndcg@10')} | "
                     f"{cell(rs, 'test', 'sampled_ndcg@10')} | {pop['popularity_ndcg@10']:.4f} / "
                     f"{pop['popularity_sampled_ndcg@10']:.4f} | {minutes:.1f} |")
    return lines


def parse_trial(text: str) -> tuple[str, list[str]]:
    name, _, overrides = text.partition("=")
    return name, shlex.split(overrides)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, help="feature job output folder")
    p.add_argument("--data-name", help="the data's name in the log (default: the folder's); the "
                   "quality report matches trials by it, so a rebuilt protocol keeps its name")
    p.add_argument("--trial", action="append", default=[], help="NAME=OVERRIDES (repeatable)")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--seeds", default="0")
    p.add_argument("--work", type=Path, default=Path("runs/model-search"))
    p.add_argument("--launcher", choices=("horovodrun", "torchrun"), default="horovodrun")
    p.add_argument("--jobs", type=int, default=1, help="trials run at once (default 1)")
    p.add_argument("--timeout", type=float, default=7200.0,
                   help="seconds a trial may train before it is stopped (its kept model is "
                        "still backtested)")
    p.add_argument("--log", type=Path, default=LOG, help="the JSON-lines log trials append to")
    p.add_argument("--table", action="store_true", help="only render the table from the log")
    args = p.parse_args(argv)
    args.log.parent.mkdir(parents=True, exist_ok=True)
    cells = [(*parse_trial(text), int(seed)) for text in args.trial
             for seed in args.seeds.split(",")]
    lock, failed = threading.Lock(), []

    def one(cell: tuple[str, list[str], int]) -> None:
        name, overrides, seed = cell
        try:
            record = run_trial(args.data, args.work, name, overrides, args.ranks, seed,
                               args.data_name, args.launcher, args.timeout)
        except Exception as exc:  # one failed trial leaves the others' records
            print(f"[model search] {name} seed {seed} failed: {exc}", file=sys.stderr,
                  flush=True)
            failed.append((name, seed))
            return
        with lock, open(args.log, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(json.dumps({k: record[k] for k in ("trial", "seed", "val", "test")}), flush=True)

    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        list(pool.map(one, cells))
    if args.log == LOG:
        records = [json.loads(line) for line in LOG.read_text().splitlines()] if LOG.exists() \
            else []
        TABLE.write_text(render(records))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
