"""Shared fixtures: the real MovieLens 100K folder and one local Spark session per test run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def ml100k_dir() -> Path:
    """MovieLens 100K lives beside the checkout (its license forbids a copy in the repo)."""
    return Path(os.environ.get("ML100K_DIR", REPO.parent / "shared" / "data" / "ml-100k"))


@pytest.fixture(scope="session")
def ml100k() -> Path:
    path = ml100k_dir()
    if not (path / "u.data").exists():
        pytest.fail(f"MovieLens 100K not found at {path}; set ML100K_DIR to its folder")
    return path


@pytest.fixture(scope="session")
def spark():
    """One real local Spark session (local[2]) shared by every test that needs it."""
    from hvd_ctsm.spark_session import get_spark

    session = get_spark(master="local[2]", app_name="hvd_ctsm-tests")
    yield session
    session.stop()


TINY_SOURCE = "synthetic:clients=160,items=60,events=6000,seed=11"


@pytest.fixture(scope="session")
def tiny_features(spark, tmp_path_factory) -> Path:
    """A small real Petastorm dataset (synthetic events) written by the real feature job."""
    from spark_jobs.build_features import build_features
    from spark_jobs.config import FeatureConfig

    out = tmp_path_factory.mktemp("features") / "tiny"
    build_features(spark, FeatureConfig(source=TINY_SOURCE, out=str(out), max_len=40,
                                        row_groups=8))
    return out
