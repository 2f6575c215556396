"""The datasets the feature job writes and the trainer reads.

- `schema`: the stored fields, the one contract between the Spark job and the trainer;
- `dataset`: `Dataset`, what the trainer, the backtest and scoring hold: path, checked
  metadata, splits' URLs, the model's sizes, the check that a model shares its vocabulary;
- `dataset_meta`: a dataset's metadata.json (splits, counts, vocabulary sizes) and its checks;
- `arrow_reader`: the default reader (pyarrow alone), rows in Petastorm's order;
- `petastorm_metadata`, `npy_codec`: Petastorm's footer and array encoding, without Petastorm;
- `batches`: shards, epoch plans and padded training batches for a rank.

May import `hvd_ctsm.files` and `hvd_ctsm.config`; `schema` and `dataset_meta` import no torch
(the Spark job uses them on executors).
"""
