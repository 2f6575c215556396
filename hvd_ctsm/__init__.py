"""hvd_ctsm: a Horovod trainer for Client Time Series Models."""

__version__ = "0.1.0"
