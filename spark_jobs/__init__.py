"""The Spark programs: what `spark-submit` runs.

- the feature job (`build_features`, with `sources`, `validate`, `split`, `vocab`, `sequences`,
  `write`): raw events into time-safe per-client sequences, written as Petastorm datasets;
- `pipeline`: the whole chain (features, training on Spark tasks, backtest, gate, deploy) as one
  Spark application;
- `score_topk`: batch scoring spread over the executors.

The pipeline and the scoring job live here rather than in hvd_ctsm because each is a file that
`spark-submit spark_jobs/NAME.py` runs and each imports the feature job's session and readers;
hvd_ctsm below its top (api, cli) never imports spark_jobs.
"""
