"""Judging a model on held-out time.

- `metrics`: NDCG, HR, MRR and AUC;
- `evaluate`: a model (or popularity) ranked over the whole catalog or sampled negatives;
- `backtest`: the backtest report of a trained model against popularity, and the model loader
  every consumer uses; `gate`: the deploy gate applied to a report.

May import data, model, files, config and tracking.
"""
