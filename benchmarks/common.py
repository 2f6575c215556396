"""What every benchmark shares: the machine stamp, launching the real entry points, statistics.

Benchmarks measure; they never assert a speed. Each one runs its variants in turn within one run
(A B C, A B C, ...) so that they share the machine's moments, and reports medians over repeats.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
ML100K = REPO.parent / "shared" / "data" / "ml-100k"
SYNTHETIC = "synthetic:clients=1200,items=300,events=60000,seed=7"  # the benchmarks' synthetic set
# Short histories over a large sparse catalog, purchases only (issue 44's stand-in shape)
SHORT_HISTORIES = ("synthetic:clients=8000,items=10000,events=72000,seed=5,cover=1,"
                   "purchases_only=1")
# The same with weaker sequences: series runs end sooner and tastes drift more often, so the
# next item is harder to tell from the last one (the defaults' p_continue=0.65, p_drift=0.05)
SHORT_HARD = SHORT_HISTORIES + ",p_continue=0.4,p_drift=0.15"
# Weaker still: series runs rarely go on, tastes drift every few runs and half the runs start
# outside the taste, so the last items say little about the next (closest to a shop log whose
# full NDCG@10 is near 0.05)
SHORT_WEAK = SHORT_HISTORIES + ",p_continue=0.15,p_drift=0.3,p_taste=0.5"
# Benchmark runs are thrown away: no MLflow run for them. Setting up a fresh MLflow store took
# 4-6 s of every short run, which is not what any benchmark measures.
NO_TRACKING = "tracking.enabled=false"


def env() -> dict:
    """The environment for child processes: this interpreter's bin first, quiet libraries."""
    bin_dir = str(Path(sys.executable).parent)
    return os.environ | {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
                         "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
                         "PYTHONPATH": str(REPO)}


def run(cmd: list[str], log: Path, timeout: float = 900) -> float:
    """Run a command to completion (its output to `log`); return its wall seconds. Past
    `timeout` it is stopped (run_until) and this raises."""
    seconds, stopped = run_until(cmd, log, timeout)
    if stopped:
        raise RuntimeError(f"{' '.join(cmd[:6])}... ran past {timeout:.0f} s (log: {log})")
    return seconds


def run_until(cmd: list[str], log: Path, timeout: float) -> tuple[float, bool]:
    """Run `cmd` (its output to `log`) in its own process group; after `timeout` seconds stop the
    whole group (a launcher's workers with it). Returns (wall seconds, whether it was stopped);
    a failure raises with the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env(),
                                cwd=REPO, start_new_session=True)
        try:
            code, stopped = proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code, stopped = 0, True
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])}... exited {code} (log: {log}):\n"
                           f"{log.read_text()[-3000:]}")
    return time.perf_counter() - t0, stopped


@contextlib.contextmanager
def work_folder(prefix: str):
    """A temporary folder for a benchmark's runs: removed when the block succeeds, kept when it
    fails (and named on stderr), so that the logs of the run that failed can be read."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    except BaseException:
        print(f"[bench] failed: the runs' logs are kept in {path}", file=sys.stderr, flush=True)
        raise
    shutil.rmtree(path, ignore_errors=True)


def horovodrun(np: int, args: list[str]) -> list[str]:
    return ["horovodrun", "-np", str(np), "--gloo", sys.executable, *args]


def torchrun(np: int, args: list[str]) -> list[str]:
    """torchrun, as this interpreter's module (a GPU image may have no `torchrun` script beside
    it); --standalone takes a free port, so runs can go side by side."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(np), "--no-python", sys.executable, *args]


def build_features(source: str, out: Path, log: Path, max_len: int = 200,
                   row_groups: int = 64) -> Path:
    """The real feature job (a local[2] Spark application) into `out`, once. Fewer
    `row_groups` than the job's default 64 for a quick run: each costs about 0.2-0.3 s of Spark
    tasks whatever its size (9,000 events: 73 s at 64, 29 s at 8)."""
    if not (out / "metadata.json").exists():
        run([sys.executable, "-m", "spark_jobs.build_features", "--source", source,
             "--out", str(out), "--split", "leave-last-out", "--max-len", str(max_len),
             "--row-groups", str(row_groups), "--master", "local[2]", "--overwrite"], log)
    return out


def machine() -> dict:
    """Machine, date and commit: every result file carries them."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit_of(REPO), "cpu": cpu, "cores": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30),
            "os": platform.platform(terse=True), "python": platform.python_version(),
            "torch": torch.__version__, "load_avg_1min": round(os.getloadavg()[0], 2)}


def commit_of(checkout: Path) -> str:
    """The checkout's commit, "+changes" when its code differs from it; "unknown" outside git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=checkout,
                                capture_output=True, text=True, check=True).stdout.strip()
        # The benchmarks' own outputs are tracked: writing them does not make the code dirty.
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                ".", ":!benchmarks/results", ":!benchmarks/RESULTS.md"],
                               cwd=checkout, capture_output=True, text=True).stdout.strip()
        return commit + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def median(values) -> float:
    return float(statistics.median(values))


def spread(values) -> dict:
    """Median, min, max and (for 2+ values) the sample standard deviation."""
    values = [float(v) for v in values]
    return {"median": median(values), "min": min(values), "max": max(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else 0.0, "n": len(values)}


def save(name: str, payload: dict, out_dir: Path = RESULTS) -> Path:
    from hvd_ctsm.files.atomic import atomic_write_bytes

    path = out_dir / f"{name}.json"
    atomic_write_bytes(path, json.dumps({"machine": machine()} | payload, indent=2).encode())
    return path


def pyplot():
    """matplotlib without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
