"""The pyfunc model as code (MLflow's "models from code"): deploy logs this file rather than a
pickled CtsmModel object, and loading the registered model runs it. MLflow warns against logging
a pickled object (unpickling may run arbitrary code); this file is what runs instead, and it
only builds the model from our installed package."""

import mlflow.models

from hvd_ctsm.tracking.pyfunc import CtsmModel

mlflow.models.set_model(CtsmModel())
