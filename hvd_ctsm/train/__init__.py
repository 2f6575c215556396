"""Training: the program that starts ranks, and what each rank does.

- `launch`: `python -m hvd_ctsm.train` / `hvd-ctsm train`, the checks before any rank starts and
  the choice of route; `spark_train` and `estimator`: the same trainer on Spark tasks;
- `loop`: the epoch loop; `elastic_loop` and `elastic`: the loop and data order under Horovod
  Elastic; `trainer`: one step, a validation, a checkpoint (shared by both loops);
- `support`: learning-rate rules, the optimizer, AMP, resume and warm start;
- `run_folder`: what --overwrite, --resume and --init-from may touch; `faults`: stragglers,
  stalls and test-only fault injection; `weight_average`, `cpu_memory`.

The top of the stack below the notebook API and the CLI: may import every other subsystem.
This file imports nothing, so importing one of its modules stays cheap.
"""
