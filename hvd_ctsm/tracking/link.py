"""Where a run's MLflow records go, and the file that ties a run folder to its MLflow run.

Standard library only (no mlflow): the trainer decides the store before mlflow is imported, and
backtest, gate and deploy read RUN/mlflow_run.json to add to the same run in the same store.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from hvd_ctsm.files.atomic import atomic_write_bytes

LINK_FILE = "mlflow_run.json"
STORE_FOLDER = "mlflow"  # beside the run folder: several runs (and deploys) share one store
CHAMPION = "champion"  # the registered model's alias for the deployed version
MODEL_URI_PREFIX = "models:/"  # models:/NAME@ALIAS or models:/NAME/VERSION


@dataclass
class RunLink:
    """One MLflow run: the store it lives in and its ids."""

    tracking_uri: str
    experiment_id: str
    run_id: str
    registered_model: str


def local_store(out: str | Path) -> tuple[str, str]:
    """The default store for a run folder: (SQLite tracking URI, artifact folder URI), in
    OUT/../mlflow, outside the run folder so that `--overwrite` of a run never removes the
    records (and registered models) of the others."""
    folder = Path(out).resolve().parent / STORE_FOLDER
    return f"sqlite:///{folder / 'mlflow.db'}", (folder / "artifacts").as_uri()


def tracking_uri(configured: str, out: str | Path) -> tuple[str, str | None]:
    """(tracking URI, artifact location for a new experiment or None for the store's own):
    the config's uri, else MLFLOW_TRACKING_URI, else the local store beside the run folder."""
    uri = configured.strip() or os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if uri:
        return uri, None
    return local_store(out)


def is_model_uri(ref: str | Path | None) -> bool:
    """Whether a --model argument names a registered model version rather than a path."""
    return str(ref or "").startswith(MODEL_URI_PREFIX)


def check_model_ref(ref: str | Path, option: str) -> None:
    """A model option takes a local path or a models:/ URI; any other URL is refused in one line
    before any work: it was taken as a path and found missing ("no model at s3://...", "s3:/b/reg
    not found"), after the dataset was opened (and, on Spark, the application started)."""
    from hvd_ctsm.files.storage import check_local

    if not is_model_uri(ref):
        check_local(ref, option, f"{MODEL_URI_PREFIX}NAME@ALIAS")


def registry_uri(configured: str, near: str | Path) -> str:
    """The store to read a registered model from: `configured`, else MLFLOW_TRACKING_URI, else
    the default local store beside `near` (a feature or run folder: NEAR/../mlflow, where the
    trainer and deploy write when nothing else is set). A local SQLite store must exist: MLflow
    would otherwise create an empty one and report the model as unknown."""
    uri = configured.strip() or os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if not uri:
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", str(near)):
            raise ValueError(f"no MLflow store to read models from: {near} is a URL, so there is "
                             "no default local store beside it; pass --tracking-uri or set "
                             "MLFLOW_TRACKING_URI")
        uri = local_store(near)[0]
    if uri.startswith("sqlite:///"):
        database = Path(uri[len("sqlite:///"):])
        if not database.is_file():
            raise ValueError(f"no MLflow store at {database}: pass --tracking-uri (or set "
                             "MLFLOW_TRACKING_URI) to the store that deploy registered the "
                             "model in, e.g. sqlite:///WORK/mlflow/mlflow.db")
    return uri


def write_link(folder: str | Path, link: RunLink) -> None:
    atomic_write_bytes(Path(folder) / LINK_FILE, json.dumps(asdict(link), indent=2).encode())


def read_link(folder: str | Path) -> RunLink | None:
    """The run folder's link, or None (tracking was off, or the folder predates it)."""
    path = Path(folder) / LINK_FILE
    try:
        values = json.loads(path.read_text())
        return RunLink(**{k: str(values[k]) for k in RunLink.__dataclass_fields__})
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is damaged ({exc}): delete it to stop logging this run to "
                         "MLflow, or retrain") from exc


def metric_key(name: str) -> str:
    """A metric name MLflow accepts: `val_full/ndcg@10` -> `val_full/ndcg_at_10` (MLflow keys
    allow letters, digits, _ - . / and spaces only)."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name.replace("@", "_at_"))


def flat_params(values: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as MLflow params: {'optim.lr': '0.002', 'model.head_weights': ...}. Keys
    of a dict-valued setting become part of a param's name, spelled as MLflow allows
    (`debug.step_delay_s={"*": 0.3}` -> `debug.step_delay_s._`: with the `*`, MLflow refused
    the run's params and tracking went off)."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict) and key != "head_weights":
            flat |= flat_params(value, f"{prefix}{key}.")
        else:
            flat[metric_key(f"{prefix}{key}")] = (json.dumps(value) if isinstance(value, dict)
                                                  else str(value))
    return flat
