"""The MLflow pyfunc flavour of a deployed CTSM: client histories in, top-K items out.

    model = mlflow.pyfunc.load_model("models:/ctsm@champion")
    model.predict(pandas.DataFrame({"client_id": ["c1"], "items": [["12", "7", "40"]]}),
                  params={"k": 5})                   # -> client_id, item_ids, scores
    udf = mlflow.pyfunc.spark_udf(spark, "models:/ctsm@champion",
                                  result_type="item_ids array<string>, scores array<double>")
    histories.withColumn("top", udf(struct("client_id", "items")))

The input and output columns are hvd_ctsm.tracking.pyfunc_input's; client ids and item ids may
be text or integers (Spark's int and bigint, pandas' int64), read as their text; a history
that is null or holds no item of the model's vocabulary gets no items, and one warning per
predict call counts such rows. The MLflow model holds the folder-registry version (model.pt
and its checksum, vocab.json, metadata.json, config.yaml, backtest.json) as one artifact, and
the model as code (model_code.py, which builds a CtsmModel), so hvd_ctsm (our wheel) must be
installed wherever the model is loaded (driver and executors), as torch is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.types.schema import AnyType, Array, ColSpec, ParamSchema, ParamSpec, Schema

VERSION_ARTIFACT = "version"  # the artifact key of the folder-registry version
MODEL_CODE = Path(__file__).with_name("model_code.py")  # what deploy logs as the python_model
DEFAULT_K = 10


class CtsmModel(mlflow.pyfunc.PythonModel):
    """Loads model.pt, vocab.json and metadata.json once; predict scores histories."""

    def load_context(self, context):
        from hvd_ctsm.data.batches import check_same_vocabulary
        from hvd_ctsm.data.dataset_meta import vocab_as_written
        from hvd_ctsm.model.checkpoint import load_model

        folder = Path(context.artifacts[VERSION_ARTIFACT])
        self.model, state = load_model(folder / "model.pt")
        self.meta = json.loads((folder / "metadata.json").read_text())
        self.vocab = vocab_as_written(folder / "vocab.json", (folder / "vocab.json").read_bytes(),
                                      self.meta.get("vocab_sha256", ""))
        check_same_vocabulary(state, self.meta, "the model", folder, "redeploy the model with "
                              "the features it was trained on")

    # The DataFrame hints tell MLflow that the explicit signature (below), not the hints,
    # describes and validates the input; without hints it warns at every log and load.
    def predict(self, context, model_input: pd.DataFrame,
                params: dict[str, Any] | None = None) -> pd.DataFrame:
        from hvd_ctsm.tracking.pyfunc_input import top_k_frame

        k = int((params or {}).get("k", DEFAULT_K))
        return top_k_frame(self.model, model_input, self.vocab, self.meta, k)


def signature(attributes: list[str]) -> ModelSignature:
    """Inputs: items (required), the optional history columns and one optional text column per
    client attribute; outputs: client_id, item_ids, scores; parameter k.
    `items` is a list of Any: MLflow refuses a null row in a required list-of-strings column,
    which failed the whole input (a Spark job) for one client; a null list of Any passes, and
    pyfunc_input reads it as an empty history. Its ids and client_id are Any too: MLflow
    refuses integers where the type is string (it casts no int to text), and users' ids are
    often integers; pyfunc_input reads them as text and refuses any other type itself."""
    inputs = Schema([
        ColSpec(AnyType(), "client_id", required=False),
        ColSpec(Array(AnyType()), "items"),
        ColSpec(Array("string"), "event_types", required=False),
        ColSpec(Array("double"), "values", required=False),
        ColSpec(Array("long"), "timestamps", required=False),
        *[ColSpec("string", name, required=False) for name in attributes]])
    outputs = Schema([ColSpec("string", "client_id"), ColSpec(Array("string"), "item_ids"),
                      ColSpec(Array("double"), "scores")])
    return ModelSignature(inputs, outputs, ParamSchema([ParamSpec("k", "long", DEFAULT_K)]))


def input_example(version: Path) -> pd.DataFrame:
    """One client with three of the model's items: logged with the model, and scored by MLflow
    when deploy logs it (a check that the registered model loads and predicts)."""
    items = [str(item) for item in json.loads((version / "vocab.json").read_text())["items"][1:4]]
    return pd.DataFrame({"client_id": ["example"], "items": [items],
                         "event_types": [["purchase"] * len(items)]})
