"""Using a model that passed its gate.

- `deploy`: the folder registry (and MLflow's where it is configured);
- `topk`: the top-K items of many clients, in item chunks; `score`: the batch scoring program;
- `pyfunc_input`: client histories given as plain lists (the MLflow pyfunc flavour's input).

May import evaluation, tracking, data, model, files and config.
"""
