"""hvd_ctsm: a Horovod trainer for Client Time Series Models.

The notebook API (hvd_ctsm.api) is reachable from here without importing torch, Spark or
Horovod until it is used: `from hvd_ctsm import build_features, train, backtest, score`.
"""

__version__ = "0.1.0"

_API = ("build_features", "train", "backtest", "score")


def __getattr__(name: str):
    # Lazy: spark_jobs imports this package (hvd_ctsm.schema) on executors without torch.
    if name == "build_features":
        from hvd_ctsm import api

        return api.build_features
    if name in _API:  # a module made callable (hvd_ctsm.api.make_callable)
        import importlib

        return importlib.import_module(f"hvd_ctsm.{name}")
    raise AttributeError(f"module 'hvd_ctsm' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_API])
