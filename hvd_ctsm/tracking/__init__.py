"""MLflow tracking, model registry and pyfunc flavour: the only package that imports mlflow.

- The trainer's rank 0 opens a run (params: the resolved config; tags: backend, ranks, dataset,
  code version; artifacts: config.yaml, metadata.json, train_summary.json) and logs every scalar
  it writes to TensorBoard (losses, lr, samples/s, time shares, validation) to it as well.
  The run ends FINISHED at writer.close(), FAILED or KILLED (Ctrl-C) when the process exits
  without it, or when a `with writer:` block raises (hvd_ctsm.tracking.runs).
- backtest and gate add their metrics, decision and report to the same run; deploy registers the
  version (pyfunc flavour: hvd_ctsm.tracking.pyfunc) and moves the `champion` alias to it.
- Batch scoring reads a registered version (models:/NAME@ALIAS) as the folder version deploy
  registered: download_model.
- The store: tracking.uri, else MLFLOW_TRACKING_URI, else SQLite beside the run folder
  (OUT/../mlflow/mlflow.db, artifacts in OUT/../mlflow/artifacts): no server needed.
- Off with tracking.enabled=false; without the mlflow package it is off too, with one log line.
  The run folder's mlflow_run.json tells the later steps which run to add to; without it they
  log nothing to MLflow.

Submodules runs, registry and pyfunc import mlflow; this facade imports them only when mlflow is
installed, so the package works without it.
"""

from __future__ import annotations

import logging
import os
from functools import cache
from pathlib import Path

from hvd_ctsm.tracking.link import (CHAMPION, LINK_FILE, RunLink, check_model_ref, is_model_uri,
                                    read_link, registry_uri, tracking_uri)

log = logging.getLogger("hvd_ctsm.tracking")
__all__ = ["CHAMPION", "LINK_FILE", "RunLink", "champion_version", "check_model_ref",
           "download_model", "is_model_uri", "log_report", "metrics_writer", "mlflow_installed",
           "read_link", "register", "tracking_uri"]


@cache
def mlflow_installed() -> bool:
    """Whether mlflow imports; says once, in one line, that tracking is off when it does not."""
    # MLflow's own INFO lines (its database's tables made, an input example checked) are no
    # news in a run's log: warnings only, unless the user set MLFLOW_LOGGING_LEVEL.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    try:
        import mlflow  # noqa: F401
    except ImportError as exc:
        log.warning("MLflow tracking is off: the mlflow package cannot be imported (%s); install "
                    "it (./run.sh setup, or pip install 'hvd_ctsm[mlflow]') to track runs. "
                    "TensorBoard and the JSON logs are written as before", exc)
        return False
    return True


def metrics_writer(tensorboard, cfg, meta: dict, backend: str, ranks: int, resume: bool):
    """Rank 0's scalar writer: TensorBoard's alone, or TensorBoard's and an MLflow run's
    (add_scalar, close). Opening the run can fail (a server down, a bad URI): one warning, and
    the training goes on without MLflow."""
    if not cfg.tracking.enabled or not mlflow_installed():
        return tensorboard
    from hvd_ctsm.tracking.runs import TeeWriter, TrackedRun

    try:
        run = TrackedRun.start(cfg, meta, backend, ranks, resume)
    except Exception as exc:  # noqa: BLE001  tracking must never stop training
        log.warning("MLflow tracking is off for this run: cannot open a run in %s (%s: %s); set "
                    "tracking.uri or MLFLOW_TRACKING_URI to a reachable store, or "
                    "tracking.enabled=false", tracking_uri(cfg.tracking.uri, cfg.out)[0],
                    type(exc).__name__, " ".join(str(exc).split()))  # SQLAlchemy's: 2 lines
        return tensorboard
    return TeeWriter(tensorboard, run, Path(cfg.out))


def _link_for(run_folder: Path) -> RunLink | None:
    link = read_link(run_folder)
    return link if link is not None and mlflow_installed() else None


def log_report(run_folder: str | Path, report_path: str | Path, report: dict,
               step: str) -> None:
    """backtest / gate: the report into the model's run, when the run was tracked. A store that
    fails now costs the MLflow record only (the report file is written): one warning."""
    link = _link_for(Path(run_folder))
    if link is None:
        return
    from hvd_ctsm.tracking.runs import log_report as log_to_run

    try:
        log_to_run(link, Path(report_path), report, step)
    except Exception as exc:  # noqa: BLE001  the report itself is already written
        log.warning("MLflow: the %s was not logged to run %s (%s: %s)", step, link.run_id,
                    type(exc).__name__, exc)


def register(run_folder: str | Path, version: Path, report: dict) -> tuple[str, str] | None:
    """deploy: the folder version as a registered model version (champion when its gate
    passed); None when the run was not tracked. Errors propagate: deploy reports them."""
    link = _link_for(Path(run_folder))
    if link is None:
        return None
    from hvd_ctsm.tracking.registry import register_version

    return register_version(link, version, report)


def champion_version(ref: str, near: str | Path | None, destination: Path) -> Path | None:
    """The version folder of models:/NAME@ALIAS (backtest.json, model.pt, metadata.json),
    downloaded into `destination` from the store of the run folder `near` (the model being
    gated), else MLFLOW_TRACKING_URI; None when no version holds the alias yet."""
    link = read_link(Path(near)) if near is not None and Path(near).is_dir() else None
    uri = link.tracking_uri if link else tracking_uri("", Path(near or "run"))[0]
    if not mlflow_installed():
        raise ValueError(f"--champion {ref} needs the mlflow package; pass the folder "
                         "registry instead (--champion REGISTRY: its current version's report)")
    from hvd_ctsm.tracking.registry import champion_version as download

    return download(uri, ref, destination)


def download_model(ref: str, configured_uri: str, near: str | Path, destination: Path) -> Path:
    """The version folder of models:/NAME@ALIAS (or models:/NAME/VERSION), downloaded into
    `destination`, from the store `configured_uri`, else MLFLOW_TRACKING_URI, else the default
    local store beside `near` (the feature folder). Bad input raises ValueError naming the fix."""
    uri = registry_uri(configured_uri, near)
    if not mlflow_installed():
        raise ValueError(f"--model {ref} needs the mlflow package; install it (./run.sh setup) "
                         "or pass the folder registry instead (REGISTRY, its `current` version)")
    from hvd_ctsm.tracking.registry import download_version

    return download_version(uri, ref, destination)
