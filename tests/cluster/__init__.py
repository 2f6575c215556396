"""A real Spark standalone cluster (master and workers on 127.0.0.1)."""
