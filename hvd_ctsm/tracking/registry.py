"""The MLflow model registry: a deployed version as a registered model version, its `champion`
alias, and the champion's backtest report for the gate's --champion comparison."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from hvd_ctsm.tracking.link import CHAMPION, RunLink
from hvd_ctsm.tracking.pyfunc import MODEL_CODE, VERSION_ARTIFACT, input_example, signature

log = logging.getLogger("hvd_ctsm.tracking")
# A progress bar per download is noise in a step's log.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
MODEL_REF = re.compile(r"^models:/([^/@]+)@([A-Za-z0-9_-]+)$")
MODEL_VERSION_REF = re.compile(r"^models:/([^/@]+)/([0-9]+)$")


def requirements() -> list[str]:
    """The pins a serving environment needs besides hvd_ctsm itself (our wheel)."""
    import numpy
    import pandas
    import torch

    return [f"mlflow=={mlflow.__version__}", f"torch=={torch.__version__.split('+')[0]}",
            f"numpy=={numpy.__version__}", f"pandas=={pandas.__version__}"]


@contextlib.contextmanager
def using_store(tracking_uri: str):
    """mlflow's global tracking URI set to `tracking_uri` for this block only. set_tracking_uri
    also exports MLFLOW_TRACKING_URI, so without the restore every training that a notebook or
    a pipeline's driver starts after a deploy would log into the registry's store."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(tracking_uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before)


def register_version(link: RunLink, version: Path, report: dict) -> tuple[str, str]:
    """Log the version folder as a pyfunc model in the run, register it under
    link.registered_model and, when its gate passed, move the `champion` alias to it.
    Returns (registered model name, version number)."""
    meta = json.loads((version / "metadata.json").read_text())
    with using_store(link.tracking_uri), mlflow.start_run(run_id=link.run_id):
        info = mlflow.pyfunc.log_model(
            name="model", python_model=str(MODEL_CODE), artifacts={VERSION_ARTIFACT: str(version)},
            signature=signature(list(meta.get("attrs", []))), pip_requirements=requirements(),
            input_example=input_example(version), registered_model_name=link.registered_model)
    number = str(info.registered_model_version)
    client = MlflowClient(tracking_uri=link.tracking_uri)
    gate = report.get("gate") or {}
    tags = {"folder_version": version.name, "model_sha256": report.get("model_sha256", ""),
            "gate.passed": str(gate.get("passed")),
            "backtest.ndcg_at_10": str(report.get("model", {}).get("full", {}).get("ndcg@10"))}
    for key, value in tags.items():
        client.set_model_version_tag(link.registered_model, number, key, value)
    if gate.get("passed") is True:
        client.set_registered_model_alias(link.registered_model, CHAMPION, number)
    return link.registered_model, number


def champion_version(tracking_uri: str, ref: str, destination: Path) -> Path | None:
    """The version folder deployed as models:/NAME@ALIAS (its backtest.json, model.pt and
    metadata.json), downloaded into `destination`; None when no version holds that alias yet
    (the first deploy has nothing to beat)."""
    match = MODEL_REF.match(ref)
    if not match:
        raise ValueError(f"--champion {ref!r}: expected models:/NAME@ALIAS (e.g. "
                         f"models:/ctsm@{CHAMPION}) or a report file")
    name, alias = match.groups()
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        found = client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise
    with using_store(tracking_uri):
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=f"models:/{name}/{found.version}", dst_path=str(destination))
    reports = sorted(Path(local).rglob("backtest.json"))
    if not reports:
        raise ValueError(f"{ref} (version {found.version}) holds no backtest.json: it was "
                         "not registered by hvd_ctsm.serving.deploy")
    return reports[0].parent


def find_version(client: MlflowClient, ref: str):
    """The model version that models:/NAME@ALIAS or models:/NAME/VERSION names; ValueError
    naming the fix when the URI, the model or the version is wrong."""
    by_alias, by_number = MODEL_REF.match(ref), MODEL_VERSION_REF.match(ref)
    if not (by_alias or by_number):
        raise ValueError(f"{ref!r} is not a registered model URI: use models:/NAME@ALIAS (e.g. "
                         f"models:/ctsm@{CHAMPION}) or models:/NAME/VERSION")
    name, wanted = (by_alias or by_number).groups()
    try:
        model = client.get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise ValueError(f"no registered model {name!r} in {client.tracking_uri}: deploy a "
                         "tracked run first, or pass the --tracking-uri of the store it was "
                         "registered in") from None
    if by_alias and wanted not in model.aliases:
        raise ValueError(f"{ref}: no version of {name!r} has the alias {wanted!r} (aliases: "
                         f"{dict(model.aliases) or 'none'}); deploy a model that passes its "
                         f"gate, or name a version: models:/{name}/NUMBER")
    number = model.aliases[wanted] if by_alias else wanted
    try:
        return client.get_model_version(name, str(number))
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise ValueError(f"{ref}: {name!r} has no version {number}; list its versions in the "
                         "MLflow UI, or use models:/NAME@ALIAS") from None


def download_version(tracking_uri: str, ref: str, destination: Path) -> Path:
    """The folder-registry version (model.pt, vocab.json, metadata.json, ...) that deploy
    registered as models:/NAME@ALIAS or models:/NAME/VERSION, downloaded into `destination`."""
    try:
        client = MlflowClient(tracking_uri=tracking_uri)
        found = find_version(client, ref)
        source = client.get_model_version_download_uri(found.name, found.version)
        local = Path(mlflow.artifacts.download_artifacts(
            artifact_uri=source, dst_path=str(destination), tracking_uri=tracking_uri))
    except MlflowException as exc:  # a URI MLflow cannot use, a server it cannot reach
        text = " ".join(str(exc).split())
        raise ValueError(f"cannot read {ref} from the MLflow store {tracking_uri} ("
                         f"{type(exc).__name__}: {text[:200]}); pass --tracking-uri (or set "
                         "MLFLOW_TRACKING_URI) to the store deploy registered the model in, "
                         "e.g. sqlite:///WORK/mlflow/mlflow.db") from None
    models = sorted(local.rglob("model.pt"))
    if len(models) != 1:
        raise ValueError(f"{ref} (version {found.version}) holds {len(models)} model.pt files, "
                         "not one: it was not registered by hvd_ctsm.serving.deploy")
    log.info("MLflow: %s is version %s of %s (folder version %s)", ref, found.version,
             found.name, (found.tags or {}).get("folder_version", "?"))
    return models[0].parent
