# %% [markdown]
# # hvd_ctsm from a notebook
# Features, training on the cluster's executors (Horovod on Spark), backtest with a gate, and
# batch scoring, each one call on the notebook's own SparkSession (`spark`, as Databricks and
# Jupyter-with-PySpark provide it). Run as a script it starts a local session instead:
#
#     python docs/notebook_example.py --work /tmp/ctsm-notebook
#     python docs/notebook_example.py --master spark://head:7077 --work /shared/ctsm-notebook
#
# On a cluster, put WORK on storage that the driver and every executor see (e.g. /dbfs/...).
# `--features DIR` (FEATURES in a notebook) starts from a dataset built before, e.g. by
# spark_jobs/build_features.py, instead of step 1.

# %%
import argparse
import json
import tempfile
from pathlib import Path

from hvd_ctsm.api import backtest_model, make_features, score_clients, train_model

if __name__ == "__main__":  # as a script: parse the options a notebook would hard-code
    parser = argparse.ArgumentParser(description="the notebook API on synthetic data")
    parser.add_argument("--work", help="the outputs' folder (default: a new temporary one)")
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--master", help="a cluster's master (default: local[NUM_PROC])")
    parser.add_argument("--features", help="an existing feature dataset (skips step 1)")
    options = parser.parse_args()
    WORK = Path(options.work or tempfile.mkdtemp(prefix="ctsm-notebook-"))
    NUM_PROC, MASTER = options.num_proc, options.master
    FEATURES = options.features
else:  # run by a test or %run with WORK (and maybe spark) already set
    WORK = Path(globals().get("WORK") or tempfile.mkdtemp(prefix="ctsm-notebook-"))
    NUM_PROC = globals().get("NUM_PROC", 2)
    MASTER, FEATURES = globals().get("MASTER"), globals().get("FEATURES")

if globals().get("spark") is None:  # a notebook has its own; a script starts one
    from hvd_ctsm.spark_session import get_spark

    spark = get_spark(master=MASTER or f"local[{NUM_PROC}]", app_name="hvd_ctsm-notebook")

# %% 1. Features: events -> time-safe sequences (Petastorm), in this SparkSession
DATA = Path(FEATURES or WORK / "features")
if FEATURES is None:
    meta = make_features(spark, "synthetic:clients=160,items=60,events=6000,seed=3", str(DATA),
                         max_len=40, row_groups=8, overwrite=True)
else:  # built before: its metadata says the same
    meta = json.loads((DATA / "metadata.json").read_text())
print("examples per split:", {k: v["rows"] for k, v in meta["splits"].items()})

# %% 2. Train: one rank per Spark task, the same trainer as under horovodrun or torchrun:
# horovod.spark where Horovod is installed, else TorchDistributor (dist.backend=auto)
summary = train_model(spark, DATA, WORK / "run", num_proc=NUM_PROC, epochs=1,
                      overrides=["data.batch_size=16", "model.dim=16", "model.layers=1",
                                 "progress=false", "dist.threads_per_rank=1"],
                      overwrite=True)  # this example's own run; resume=True would go on
print("steps:", summary["steps"], "ranks:", summary["ranks"])

# %% 3. Backtest on held-out time, against popularity, with a gate
report = backtest_model(DATA, WORK / "run", gate="sampled.hr@10>=0.05",
                        report=WORK / "backtest.json")
print("NDCG@10 full:", round(report["model"]["full"]["ndcg@10"], 4),
      "popularity:", round(report["popularity"]["full"]["ndcg@10"], 4),
      "gate passed:", report["gate"]["passed"])

# %% 4. Batch scoring on the executors: top-10 unseen items per client (Parquet)
scored = score_clients(spark, DATA, WORK / "run", WORK / "scores", k=10,
                       overwrite=True)
print(json.dumps(scored))
spark.read.parquet(str(WORK / "scores")).orderBy("client_id", "rank").show(5)
