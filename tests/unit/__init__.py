"""The unit tier: pure Python and torch in the test process, no Spark, workers or datasets."""
