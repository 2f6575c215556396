"""The MLflow pyfunc flavour of a deployed CTSM: client histories in, top-K items out.

    model = mlflow.pyfunc.load_model("models:/ctsm@champion")
    model.predict(pandas.DataFrame({"client_id": ["c1"], "items": [["12", "7", "40"]]}),
                  params={"k": 5})                   # -> client_id, item_ids, scores
    udf = mlflow.pyfunc.spark_udf(spark, "models:/ctsm@champion",
                                  result_type="item_ids array<string>, scores array<double>")
    histories.withColumn("top", udf(struct("client_id", "items")))

The input and output columns are hvd_ctsm.serving's. The MLflow model holds the folder-registry
version (model.pt and its checksum, vocab.json, metadata.json, config.yaml, backtest.json) as one
artifact; the class is pickled by reference, so hvd_ctsm (our wheel) must be installed wherever
the model is loaded (driver and executors), as torch is.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import mlflow.pyfunc
from mlflow.models import ModelSignature
from mlflow.types.schema import Array, ColSpec, ParamSchema, ParamSpec, Schema

VERSION_ARTIFACT = "version"  # the artifact key of the folder-registry version
DEFAULT_K = 10


# MLflow warns, whenever the model is logged or loaded, that predict has no type hints: the
# explicit signature (below) is what describes and validates the input, so the warning says
# nothing here. Only that message is silenced.
warnings.filterwarnings("ignore", message=".*type hints to the `predict` method.*")


class CtsmModel(mlflow.pyfunc.PythonModel):
    """Loads model.pt, vocab.json and metadata.json once; predict scores histories."""

    def load_context(self, context):
        import json

        from hvd_ctsm.checkpoint import load_state
        from hvd_ctsm.data import check_same_vocabulary
        from hvd_ctsm.model import CTSM

        folder = Path(context.artifacts[VERSION_ARTIFACT])
        state = load_state(folder / "model.pt")
        self.meta = json.loads((folder / "metadata.json").read_text())
        self.vocab = json.loads((folder / "vocab.json").read_text())
        check_same_vocabulary(state, self.meta, "the model", folder, "redeploy the model with "
                              "the features it was trained on")
        self.model = CTSM.from_checkpoint(state)

    def predict(self, context, model_input, params=None):
        from hvd_ctsm.serving import top_k_frame

        k = int((params or {}).get("k", DEFAULT_K))
        return top_k_frame(self.model, model_input, self.vocab, self.meta, k)


def signature(attributes: list[str]) -> ModelSignature:
    """Inputs: items (required), the optional history columns and one optional text column per
    client attribute; outputs: client_id, item_ids, scores; parameter k."""
    inputs = Schema([
        ColSpec("string", "client_id", required=False),
        ColSpec(Array("string"), "items"),
        ColSpec(Array("string"), "event_types", required=False),
        ColSpec(Array("double"), "values", required=False),
        ColSpec(Array("long"), "timestamps", required=False),
        *[ColSpec("string", name, required=False) for name in attributes]])
    outputs = Schema([ColSpec("string", "client_id"), ColSpec(Array("string"), "item_ids"),
                      ColSpec(Array("double"), "scores")])
    return ModelSignature(inputs, outputs, ParamSchema([ParamSpec("k", "long", DEFAULT_K)]))
