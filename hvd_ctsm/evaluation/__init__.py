"""Judging a model on held-out time.

- `metrics`: NDCG, HR, MRR and AUC;
- `evaluate`: a model (or popularity) ranked over the whole catalog or sampled negatives;
- `backtest`: the backtest report of a trained model against popularity;
- `champion`: the model a gate compares with (--champion), on the same targets only;
- `gate`: the deploy gate's rules, and `decide`, the one place a gate is applied to a report,
  written and printed (the backtest, the gate step and the notebook API call it).

May import data, model, files, config and tracking.
"""
