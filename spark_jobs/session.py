"""The feature job's SparkSession: hvd_ctsm.spark_session, where the package's lower layers can
reach it without importing spark_jobs (spark_jobs builds on hvd_ctsm, never the other way)."""

from hvd_ctsm.spark_session import DEFAULT_CONF, get_spark

__all__ = ["DEFAULT_CONF", "get_spark"]
