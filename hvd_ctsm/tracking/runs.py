"""A training run's MLflow run: opened by the trainer's rank 0, added to by backtest and gate.

Everything goes through MlflowClient with explicit ids (no process-wide active run), so the
trainer, a Spark driver or a test can hold several stores at once.

How a run ends: the trainer's writer.close() marks it FINISHED; `with writer:` marks it FAILED
(KILLED for Ctrl-C) when the block raises. A run still open when the process exits never reached
close(): the training crashed (the trainer's exception became exit code 3) or was interrupted,
so an exit hook marks it FAILED, or KILLED after an uncaught KeyboardInterrupt. A process killed
by a signal (SIGKILL, or SIGTERM from a launcher) runs no hook: its run stays RUNNING.
"""

from __future__ import annotations

import atexit
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

from hvd_ctsm.tracking.link import RunLink, flat_params, metric_key, tracking_uri, write_link

log = logging.getLogger("hvd_ctsm.tracking")
BATCH = 100  # MLflow's limit of params (and tags) per log_batch call
FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"  # MLflow's run end states


def end_status(error: type[BaseException] | None) -> str:
    """The end state of a run whose training stopped with `error` (None: it completed)."""
    if error is None:
        return FINISHED
    return KILLED if issubclass(error, KeyboardInterrupt) else FAILED


def code_version() -> str:
    """The package version, with the git commit when it runs from a checkout."""
    import hvd_ctsm

    folder = Path(hvd_ctsm.__file__).parent
    try:
        commit = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{hvd_ctsm.__version__}+{commit[:12]}" if commit else hvd_ctsm.__version__


def dataset_tags(meta: dict, data: str) -> dict[str, str]:
    counts = meta.get("counts", {})
    splits = meta.get("splits", {})
    return {"dataset.path": str(Path(data).resolve()), "dataset.source": str(meta.get("source")),
            "dataset.schema_version": str(meta.get("schema_version")),
            "dataset.vocab_sha256": str(meta.get("vocab_sha256", "")),
            "dataset.code_version": str(meta.get("code_version", "")),
            "dataset.clients": str(counts.get("clients")),
            "dataset.items": str(counts.get("items")),
            "dataset.train_rows": str(splits.get("train", {}).get("rows"))}


def experiment_id(client: MlflowClient, name: str, artifacts: str | None) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifacts)
    except Exception:  # noqa: BLE001  another run created it first: use that one
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


class TrackedRun:
    """One MLflow run; metrics are buffered per step and sent in one call per step."""

    def __init__(self, link: RunLink):
        self.link = link
        self.client = MlflowClient(tracking_uri=link.tracking_uri)
        self.pending: list[Metric] = []

    def opened(self) -> TrackedRun:
        """Mark this run as open in this process: the exit hook ends it unless finish() does
        (in this process only: a forked child that exits must not end its parent's run)."""
        self.opened_by = os.getpid()
        OPEN_RUNS[self.link.run_id] = self
        return self

    @classmethod
    def start(cls, cfg, meta: dict, backend: str, ranks: int, resume: bool) -> TrackedRun:
        """A new run for cfg.out (or, with --resume, the one its link names), with params,
        tags and the first artifacts; the link is written into the run folder."""
        from hvd_ctsm.config import to_dict
        from hvd_ctsm.tracking.link import read_link

        out = Path(cfg.out)
        uri, artifacts = tracking_uri(cfg.tracking.uri, out)
        if uri.startswith("sqlite:///"):
            Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        earlier = read_link(out) if resume else None
        if earlier is not None and earlier.tracking_uri == uri:
            run = cls(earlier)
            run.client.update_run(earlier.run_id, status="RUNNING")
            log.info("MLflow: resuming run %s in %s", earlier.run_id, uri)
            return run.opened()
        client = MlflowClient(tracking_uri=uri)
        experiment = experiment_id(client, cfg.tracking.experiment, artifacts)
        tags = {"backend": backend, "ranks": str(ranks), "hvd_ctsm.version": code_version(),
                "run_folder": str(out.resolve()), **dataset_tags(meta, cfg.data.path)}
        created = client.create_run(experiment, run_name=out.name, tags=tags)
        link = RunLink(uri, experiment, created.info.run_id, cfg.tracking.registered_model)
        run = cls(link).opened()
        params = [Param(k, v[:6000]) for k, v in flat_params(to_dict(cfg)).items()]
        for i in range(0, len(params), BATCH):
            run.client.log_batch(link.run_id, params=params[i:i + BATCH])
        run.log_files(out / "config.yaml", Path(cfg.data.path) / "metadata.json")
        write_link(out, link)
        log.info("MLflow: run %s in %s (mlflow ui --backend-store-uri %s)", link.run_id, uri,
                 uri)
        return run

    def buffer(self, key: str, value: float, step: int) -> None:
        if self.pending and self.pending[-1].step != step:
            self.flush()
        self.pending.append(Metric(metric_key(key), float(value), int(time.time() * 1000),
                                   int(step)))

    def flush(self) -> None:
        if self.pending:
            batch, self.pending = self.pending, []
            self.client.log_batch(self.link.run_id, metrics=batch)

    def log_files(self, *paths: Path) -> None:
        for path in paths:
            if Path(path).is_file():
                self.client.log_artifact(self.link.run_id, str(path))

    def set_tags(self, tags: dict[str, str]) -> None:
        self.client.log_batch(self.link.run_id,
                              tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def finish(self, out: Path | None, status: str = FINISHED) -> None:
        """End the run: the buffered metrics, train_summary.json (when written), the status."""
        OPEN_RUNS.pop(self.link.run_id, None)
        self.flush()
        if out is not None:
            self.log_files(out / "train_summary.json")
        self.client.set_terminated(self.link.run_id, status)
        if status != FINISHED:
            log.info("MLflow: run %s ended %s (the training stopped before its end)",
                     self.link.run_id, status)


OPEN_RUNS: dict[str, TrackedRun] = {}  # runs this process opened and has not ended yet


@atexit.register
def end_open_runs() -> None:
    """At exit, runs nobody closed: the training stopped early. FAILED, or KILLED when the
    process ends on a KeyboardInterrupt (sys.last_type, which hvd_ctsm.errors.run_cli sets
    when it turns Ctrl-C into exit 130; it turns other exceptions into exit code 3 and leaves
    no last_type)."""
    status = end_status(getattr(sys, "last_type", None) or Exception)
    for run in [run for run in OPEN_RUNS.values() if run.opened_by == os.getpid()]:
        try:
            run.finish(None, status)
        except Exception as exc:  # noqa: BLE001  the process is exiting anyway
            log.warning("MLflow: run %s could not be marked %s (%s: %s); it stays RUNNING",
                        run.link.run_id, status, type(exc).__name__, exc)


class TeeWriter:
    """TensorBoard's SummaryWriter and the MLflow run behind the writer's add_scalar/close, so
    the trainer logs each scalar once. An MLflow failure mid-run (a server gone) costs the MLflow
    record, never the training: one warning, then TensorBoard alone. As a context manager (like
    SummaryWriter), leaving the block closes it: FINISHED, or FAILED/KILLED on an exception."""

    def __init__(self, tensorboard, run: TrackedRun, out: Path):
        self.tensorboard, self.run, self.out = tensorboard, run, out

    def _mlflow(self, action, *args) -> None:
        if self.run is None:
            return
        try:
            action(*args)
        except Exception as exc:  # noqa: BLE001  tracking must never stop training
            log.warning("MLflow tracking stopped for this run (%s: %s); TensorBoard and the "
                        "JSON logs go on", type(exc).__name__, exc)
            OPEN_RUNS.pop(self.run.link.run_id, None)  # the store failed: no retry at exit
            self.run = None

    def add_scalar(self, key: str, value, step: int) -> None:
        self.tensorboard.add_scalar(key, value, step)
        if self.run is not None:
            self._mlflow(self.run.buffer, key, value, step)

    def close(self, status: str = FINISHED) -> None:
        self.tensorboard.close()
        if self.run is not None:
            self._mlflow(self.run.finish, self.out, status)

    def __enter__(self) -> TeeWriter:
        return self

    def __exit__(self, error_type, error, traceback) -> None:
        self.close(end_status(error_type))


def log_report(link: RunLink, report_path: Path, report: dict, step: str) -> None:
    """A backtest or gate step's report into the run: its metrics (backtest), the gate's
    decision as tags and the report file as an artifact."""
    run = TrackedRun(link)
    if step == "backtest":
        for name in ("model", "popularity", "baseline", "champion"):
            for protocol, values in (report.get(name) or {}).items():
                if isinstance(values, dict):
                    for key, value in values.items():
                        if isinstance(value, (int, float)):
                            run.buffer(f"backtest/{name}/{protocol}/{key}", value, 0)
        run.flush()
    gate = report.get("gate") or {}
    run.set_tags({"gate.passed": gate.get("passed"),
                  "gate.rules": "; ".join(c["rule"] for c in gate.get("checks", [])) or "none"})
    run.log_files(report_path)
    log.info("MLflow: %s logged to run %s", step, link.run_id)
