"""The trainer on Spark executors (horovod.spark.run, Gloo) end to end on ML-100K, local[2]."""

import json
import signal

import pytest

from hvd_ctsm.train.spark_train import NICS_ENV, SparkTrainingError, spark_nics, train_on_spark

pytestmark = [pytest.mark.spark, pytest.mark.horovod, pytest.mark.slow]
SMALL = ["data.batch_size=64", "model.dim=16", "model.layers=1", "progress=false",
         "log_every_steps=5", "dist.threads_per_rank=1"]


@pytest.fixture(scope="module")
def ml_features(spark, ml100k, tmp_path_factory):
    from spark_jobs.build_features import build_features
    from spark_jobs.config import FeatureConfig

    out = tmp_path_factory.mktemp("spark_train") / "ml100k"
    build_features(spark, FeatureConfig(source=f"movielens:{ml100k}", out=str(out), max_len=50,
                                        row_groups=8))
    return out


def test_two_ranks_on_spark_write_a_model_and_a_report(spark, ml_features, tmp_path):
    """A typed config goes to the ranks as it is (the other tests here pass a command line,
    which train_on_spark still parses as the CLI does)."""
    from hvd_ctsm.config import load_config
    from hvd_ctsm.evaluation.backtest import run_backtest

    out = tmp_path / "run"
    cfg = load_config(None, [f"data.path={ml_features}", f"out={out}", "epochs=1",
                             "dist.spark_nics=lo", *SMALL])
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    summary = train_on_spark(cfg, num_proc=2, spark=spark)
    # Horovod's launcher left its own there: after it, Ctrl-C did nothing (a notebook's too)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    assert summary["ranks"] == 2
    assert [r["gloo_iface"] for r in summary["spark_ranks"]] == ["lo", "lo"]  # nics= reached Gloo
    assert summary["steps"] == summary["steps_per_epoch"] > 0  # one whole epoch
    checksums = summary["parameter_checksums"]
    assert len(checksums) == 2 and checksums[0] == checksums[1]  # ranks in sync
    assert summary["validation"]["full"]["targets"] == 943  # every ML-100K user validated
    assert (out / "model.pt").exists() and (out / "config.yaml").exists()
    # Rank 0 alone wrote the run folder: one TensorBoard file, one log line per logged step.
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1
    log_lines = (out / "train_log.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in log_lines]
    assert steps == sorted(set(steps))
    report = run_backtest(str(ml_features), str(out))
    assert report["model"]["full"]["targets"] == 943
    assert 0 < report["model"]["sampled"]["hr@10"] <= 1


def test_more_ranks_than_task_slots_is_refused_before_starting(spark, ml_features, tmp_path):
    with pytest.raises(SparkTrainingError, match="has 2 task slots after waiting 0 s") as err:
        train_on_spark(["--data", str(ml_features), "--out", str(tmp_path / "run")],
                       num_proc=3, spark=spark)  # local[2]: slots never grow, no waiting
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()


def test_a_network_interface_this_host_lacks_is_refused_in_one_line(spark, tiny_features,
                                                                     tmp_path, monkeypatch):
    monkeypatch.setenv(NICS_ENV, "lo,nosuchnic0")  # the environment's default of the setting
    with pytest.raises(SparkTrainingError, match="nosuchnic0 .* not on this host") as err:
        train_on_spark(["--data", str(tiny_features), "--out", str(tmp_path / "run")],
                       num_proc=2, spark=spark)
    assert "\n" not in str(err.value) and "lo" in str(err.value)  # names what the host has
    assert not (tmp_path / "run").exists()


def test_the_nics_setting_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv(NICS_ENV, "nosuchnic0")
    assert spark_nics(" lo ") == ["lo"]
    monkeypatch.setenv(NICS_ENV, "lo")
    assert spark_nics(None) == ["lo"]
    monkeypatch.delenv(NICS_ENV)
    assert spark_nics(None) is None  # Horovod's own choice
