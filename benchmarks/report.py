"""Render benchmarks/results/*.json into benchmarks/RESULTS.md (tables, plots, targets).

    python benchmarks/report.py [--results DIR] [--out RESULTS.md]

The written analysis (causes, chosen defaults) lives in benchmarks/ANALYSIS.md and is included
as is; everything else here is computed from the saved measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO, RESULTS  # noqa: E402


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def med(stats: dict, fmt: str = "{:.2f}") -> str:
    """median [min-max] of a spread() dict."""
    if stats["n"] == 1:
        return fmt.format(stats["median"])
    return f"{fmt.format(stats['median'])} [{fmt.format(stats['min'])}-{fmt.format(stats['max'])}]"


def stamp(payload: dict) -> str:
    m = payload["machine"]
    return (f"_{m['date']}, commit {m['commit']}, {m['cores']} cores ({m['cpu']}), "
            f"{m['memory_gib']} GiB, {m['os']}, torch {m['torch']}; load average "
            f"{m['load_avg_1min']} when saved._")


def scaling(p: dict) -> list[str]:
    s = p["summary"]
    rows = ["| ranks | epoch s | time vs 1 rank | rows/s | allreduce wait | data wait |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n, r in s["sizes"].items():
        note = " (oversubscribed)" if r["oversubscribed"] else ""
        rows.append(f"| {n}{note} | {med(r['epoch_seconds'], '{:.1f}')} "
                    f"| {r['time_vs_np1']:.2f}x | {med(r['rows_per_s'], '{:.0f}')} "
                    f"| {med(r['allreduce_share'], '{:.1%}')} | {med(r['data_share'], '{:.1%}')} |")
    out = [f"Data: {p['data']}, preset {p['config']}, one epoch, {p['repeats']} repeats "
           "(median [min-max]).", "", *rows, ""]
    if "np2_efficiency_vs_pair" in s:
        out += [f"Two independent single-rank trainers side by side: "
                f"{med(s['pair_rows_per_s'], '{:.0f}')} rows/s together. The np=2 job reaches "
                f"**{med(s['np2_efficiency_vs_pair'], '{:.1%}')}** of that (each repeat against "
                "the pair run in the same repeat).", ""]
    if "np2_wait_split_per_step" in s:
        w = s["np2_wait_split_per_step"]
        out += [f"Logged every step (an extra np=2 run per repeat, not timed), the allreduce "
                f"wait was {med(w['allreduce_share'], '{:.1%}')} of step time on average over "
                f"the ranks and {med(w['least_waiting_rank_share'], '{:.1%}')} for the rank "
                "that waited least in each step: the allreduce itself. The difference is ranks "
                "waiting for a peer whose batch took longer.", ""]
    out += [f"![epoch time vs workers](results/{p['plots'][0]}) "
            f"![communication share](results/{p['plots'][1]})", ""]
    return out


def comm(p: dict) -> list[str]:
    peer = p["peer"]
    out = [f"Data: {p['data']}, {p['steps']} timed steps per run (30% of that on the heavy "
           f"model), np=2, one thread per rank; {p['repeats']} Horovod/DDP pairs, "
           f"{p.get('knob_repeats', p['repeats'])} passes over the knob variants. "
           f"Trainer CPU defaults: {p['cpu_defaults']} (None: see hvd_ctsm/config).", "",
           "| | samples/s |", "| --- | ---: |",
           f"| Horovod (trainer defaults) | {med(peer['horovod_samples_per_s'], '{:.0f}')} |",
           f"| PyTorch DDP (torchrun, Gloo) | {med(peer['ddp_samples_per_s'], '{:.0f}')} |",
           f"| **Horovod / DDP** | **{med(peer['horovod_over_ddp'])}** |", ""]
    if "horovod_over_pair" in peer:  # results before 2026-11-22 had no independent pair here
        out[-1:-1] = [
            f"| two independent single-rank workers (no communication) "
            f"| {med(peer['pair_samples_per_s'], '{:.0f}')} |",
            f"| **Horovod / independent pair** | **{med(peer['horovod_over_pair'])}** |",
            f"| DDP / independent pair | {med(peer['ddp_over_pair'])} |"]
    for model, res in p["knobs"].items():
        out += [f"Knobs, {model} model ({res['parameters']:,} parameters):", "",
                "| variant | gradient MB/step | samples/s | vs defaults | step ms "
                "| allreduce wait | CPU busy while waiting | cores taken by other threads |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for name, v in res["variants"].items():
            cpu = (f"| {med(v['wait_cpu_share'], '{:.0%}')} "
                   f"| {med(v['other_threads_cores'], '{:.3f}')} |"
                   if "wait_cpu_share" in v else "| | |")
            out.append(f"| {name} | {v['gradient_bytes_per_step'] / 2**20:.1f} "
                       f"| {med(v['samples_per_s'], '{:.0f}')} | {med(v['vs_defaults'])} "
                       f"| {1000 * v['step_median_s']['median']:.0f} "
                       f"| {med(v['wait_share'], '{:.1%}')} {cpu}")
        out.append("")
    return out


def input_pipeline(p: dict) -> list[str]:
    r = p["read_rows_per_s_per_rank"]
    out = [f"Data: {p['data']}, batch {p['batch_size']}, np=2 sharding, {p['repeats']} repeats.",
           "", "| reader | rows/s per rank (slower shard) |", "| --- | ---: |",
           *([f"| pyarrow alone (the default reader since 2026-11) | {med(r['arrow'], '{:.0f}')} |"]
             if "arrow" in r else []),
           f"| Petastorm rows, our .npy decoder | {med(r['ours'], '{:.0f}')} |",
           f"| Petastorm's own decoder (np.load) | {med(r['petastorm_np_load'], '{:.0f}')} |", ""]
    if p.get("trainer"):
        t = p["trainer"]
        out += [f"The trainer at np=2 consumes {med(t['rows_per_s_per_rank'], '{:.0f}')} rows/s "
                f"per rank and waits for data {med(t['data_wait_share'], '{:.1%}')} of its step "
                "time (one-epoch runs of the scaling benchmark).", ""]
    if p.get("data_wait_by_epoch"):
        w = p["data_wait_by_epoch"]
        out += [f"In {len(w['runs'])} runs of {len(w['runs'][0])} epochs at np=2, logged once "
                f"per epoch, the data wait was {med(w['first_epoch'], '{:.2%}')} of step time in "
                f"the first epoch (the shuffle buffer's first fill) and "
                f"{med(w['later_epochs'], '{:.2%}')} in the later ones (their readers open "
                "`data.read_ahead_steps` steps before the previous epoch ends).", ""]
    return out


def quality(p: dict) -> list[str]:
    out = [f"Data: {p['data']}, {p['epochs']} epochs, seeds 0..{p['seeds'] - 1}; test split, "
           "full ranking.", "",
           "| variant | effective batch | lr rule | steps | NDCG@10 mean | [min-max] | stdev "
           "| sampled NDCG@10 |", "| --- | ---: | --- | ---: | ---: | --- | ---: | ---: |"]
    for name, t in p["table"].items():
        n = t["ndcg@10"]
        out.append(f"| {name} | {t['effective_batch']} | {t['lr_rule']} "
                   f"| {t['steps']} | {n['mean']:.4f} | {n['min']:.4f}-{n['max']:.4f} "
                   f"| {n['stdev']:.4f} | {med(t['sampled_ndcg@10'], '{:.3f}')} |")
    out.append("")
    for name, v in p["verdict"].items():
        out.append(f"- {name}: mean {v['mean_minus_x1']:+.4f} against x1; inside "
                   f"x1's range over seeds: {v['in_x1_range']}; within 2 stdev of x1: "
                   f"{v['within_2_stdev']}.")
    return [*out, ""]


def trainer_ab(p: dict) -> list[str]:
    """One side-by-side check of trainer settings (benchmarks/trainer_ab.py)."""
    out = [f"Data: {p['data']}, preset {p['config']}, np={p['np']} "
           f"({p.get('backend', 'horovod')}), {p['epochs']} epoch(s), "
           f"{p['repeats']} repeats, variants in turn.", "",
           "| variant | s per epoch | time vs first | allreduce wait | data wait, 1st epoch "
           "| data wait, later epochs | kernel share of CPU |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, v in p["summary"].items():
        later, kernel = v.get("data_share_later_epochs"), v.get("kernel_share_of_cpu")
        out.append(f"| `{name}` | {med(v['epoch_seconds'], '{:.1f}')} | {med(v['vs_first'])} "
                   f"| {med(v['allreduce_share'], '{:.1%}')} "
                   f"| {med(v['data_share_first_epoch'], '{:.1%}')} "
                   f"| {med(later, '{:.2%}') if later else '-'} "
                   f"| {med(kernel, '{:.1%}') if kernel else '-'} |")
    return [*out, ""]


def spark_features(p: dict) -> list[str]:
    from benchmarks.spark_features import render

    return [render(p)]


def scale_section(p: dict) -> list[str]:
    from benchmarks.scale import render

    return render(p)


def code_ab_section(p: dict) -> list[str]:
    from benchmarks.code_ab import render

    return render(p)


def gpu_section(p: dict) -> list[str]:
    from benchmarks.gpu import render

    return render(p)


SECTIONS = [("scaling", "Scaling: epoch time and communication vs workers", scaling),
            ("comm", "Horovod vs DDP, and Horovod's knobs", comm),
            ("input_pipeline", "Input pipeline", input_pipeline),
            ("quality", "Quality vs scale (do no harm)", quality),
            ("spark_features", "Spark feature job", spark_features),
            ("scale", "Catalog scale", scale_section),
            ("gpu", "GPU check (scripts/gpu_check.sh)", gpu_section)]


def render(results: Path) -> str:
    lines = ["# Benchmark results", "",
             "Generated by `./run.sh bench` (benchmarks/run_all.py, then benchmarks/report.py). "
             "Variants run in turn within one run; figures are medians over repeats, "
             "[min-max] beside them.", ""]
    analysis = REPO / "benchmarks" / "ANALYSIS.md"
    if analysis.exists():
        lines += [analysis.read_text().rstrip(), ""]
    for name, title, fn in SECTIONS:
        path = results / f"{name}.json"
        if path.exists():
            payload = json.loads(path.read_text())
            lines += [f"## {title}", "", stamp(payload), "", *fn(payload)]
    for path in sorted(results.glob("gpu_*.json")):  # later GPU checks, each on its own day
        payload = json.loads(path.read_text())
        lines += [f"## GPU check (scripts/gpu_check.sh) of {path.stem.removeprefix('gpu_')}", "",
                  stamp(payload), "", *gpu_section(payload)]
    for path in sorted(results.glob("code_ab_*.json")):
        payload = json.loads(path.read_text())
        lines += [f"## Two revisions side by side: {path.stem.removeprefix('code_ab_')}", "",
                  stamp(payload), "", *code_ab_section(payload)]
    for path in sorted(results.glob("ab_*.json")):
        payload = json.loads(path.read_text())
        lines += [f"## Trainer side by side: {path.stem[3:]}", "", stamp(payload), "",
                  *trainer_ab(payload)]
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "RESULTS.md")
    args = p.parse_args(argv)
    text = render(args.results)
    # Plots are linked as results/NAME, right for benchmarks/RESULTS.md; elsewhere, relative.
    where = os.path.relpath(args.results.resolve(), args.out.resolve().parent)
    text = text.replace("](results/", f"]({where}/")
    tmp = args.out.with_suffix(".md.tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(text)
    tmp.replace(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
