"""hvd_ctsm: a Horovod trainer for Client Time Series Models.

Importing the package imports nothing else: spark_jobs uses it (hvd_ctsm.data.schema) on executors
without torch. The notebook functions are in hvd_ctsm.api:
`from hvd_ctsm.api import make_features, train_model, backtest_model, score_clients`.
"""

__version__ = "0.1.0"
