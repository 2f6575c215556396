"""Using a model that passed its gate.

- `deploy`: the folder registry (and MLflow's where it is configured);
- `score`: the batch scoring program. Its core, the top-K items of many clients in item chunks,
  is hvd_ctsm.model.topk, which the MLflow pyfunc flavour shares (hvd_ctsm.tracking.pyfunc_input:
  client histories given as plain lists).

May import evaluation, tracking, data, model, files and config.
"""
