"""The contract between the Spark feature job and the trainer: one table of fields (a Petastorm
Unischema where Petastorm is installed).

One row is one example: a window of at most `max_len` consecutive events of one client (the
history, oldest first) and the targets predicted from it. Each target names the history position
whose state predicts it (`target_pos`); every history event at or before that position is strictly
earlier in time than the target (ties in time are resolved by pointing at an earlier position), so
a model with a causal mask can never see the future of a target.

- training rows: a client's history cut into windows; every event of the training period whose
  predecessor state is in the window is a target (the model is trained at every position).
- validation / test rows: one per client, the history before the client's target event, one target,
  plus the items needed to rank fairly: `prior_items` (seen before the target, masked in full
  ranking) and `client_items` (ever seen, excluded from sampled negatives).
- serving rows (split "serving"): one per client, the client's latest `max_len` events, all of
  them (no time cutoff: the newest event is the last history position), and no target (every
  target array is empty). `prior_items` and `client_items` are both every item the client ever
  had: what batch scoring excludes. Never read for training or evaluation.

Bump SCHEMA_VERSION on any change; the trainer refuses a dataset of another version. The serving
split came without a bump: the row layout is the same (only target arrays may be empty, which
`hvd_ctsm.data.batches.collate` handles), and version-1 readers never open a folder they do not
name.
A version-1 dataset without it predates it: scoring then falls back to the test rows and says so.
"""

from __future__ import annotations

import warnings

import numpy as np

SCHEMA_VERSION = 1

# Petastorm 0.13 calls pyarrow APIs deprecated since pyarrow 5: a FutureWarning each time it opens
# a file system or reads or writes a dataset's metadata, in every reader thread and in every Spark
# Python worker (270 lines of them in the demo's feature step). They say nothing about the data;
# keep the logs readable. In this process (any that reads or writes a dataset imports this module):
warnings.filterwarnings("ignore", category=FutureWarning, module=r"petastorm(\.|$)")
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"petastorm(\.|$)")
# In Spark's Python workers, through their PYTHONWARNINGS (hvd_ctsm.spark_session), which names
# modules exactly: the ones that warn there.
PETASTORM_WORKER_WARNINGS = ",".join(
    f"ignore::FutureWarning:petastorm.{module}"
    for module in ("fs_utils", "utils", "etl.dataset_metadata"))

# Event types, fixed so a model trained on one dataset reads another. 0 is padding.
EVENT_TYPES = ("purchase", "rating", "view", "profile")
EVENT_TYPE_INDEX = {name: i + 1 for i, name in enumerate(EVENT_TYPES)}
# The largest |value| an event may have. A value reaches the encoder's first layer norm times
# its numeric layers' gain (1.7-5.8 in the trained models measured); beyond about 1.8e19 there
# its float32 squares overflow: the client's state is degenerate (found at 1e20), then NaN
# (1e30). 1e15 leaves a factor of 10^4 for larger gains and exceeds any price or quantity. The
# feature job rejects larger values (out_of_range_value); the pyfunc input refuses them.
MAX_EVENT_VALUE = 1e15
PAD = 0

SPLITS = ("train", "validation", "test")  # the splits with targets (training and backtesting)
SERVING_SPLIT = "serving"  # every client's latest events, no targets (batch scoring)
OUTPUT_SPLITS = (*SPLITS, SERVING_SPLIT)  # every folder the feature job writes


# Every column of a row, in one table that both readers use: (name, numpy dtype, shape). A shape
# of () is a scalar column (Parquet string or int32); any other is an array stored as the bytes of
# `np.save` (Petastorm's NdarrayCodec). The Unischema below and the Petastorm-free reader
# (hvd_ctsm.data.arrow_reader) are both built from it, so they cannot disagree.
FIELDS = (
    ("client_id", np.str_, ()),
    ("history_len", np.int32, ()),
    # History, oldest first; all arrays have history_len entries.
    ("item", np.int32, (None,)),  # item index (vocabulary), >= 1
    ("event_type", np.int32, (None,)),  # EVENT_TYPE_INDEX
    ("value", np.float32, (None,)),  # e.g. the rating; 0 when the event has none
    ("timestamp", np.int64, (None,)),  # unix seconds
    ("log_gap", np.float32, (None,)),  # log1p(hours since the previous event), 0 for the first
    ("client_attrs", np.int32, (None, None)),  # [history_len, n_attrs] as of each event
    # Targets; all arrays have the same length (>= 1; 0 in serving rows).
    ("target_pos", np.int32, (None,)),  # history position whose state predicts the target
    ("target_item", np.int32, (None,)),
    ("target_label", np.float32, (None,)),  # the p(sale) label (e.g. purchase, rating >= 4)
    ("target_time", np.int64, (None,)),
    ("target_log_dt", np.float32, (None,)),  # log1p(hours from target_pos's event to target)
    # Evaluation and serving rows only (empty in training rows).
    ("prior_items", np.int32, (None,)),
    ("client_items", np.int32, (None,)),
)
SCALAR_TYPES = {name: dtype for name, dtype, shape in FIELDS if shape == ()}
def spark_types() -> list[tuple[str, object]]:
    """(column, Spark SQL type) in FIELDS's order (which Petastorm's Unischema keeps, and the files
    store): strings, 32-bit ints, and binary for the arrays
    (what Petastorm's codecs declare for these fields). Imports pyspark."""
    from pyspark.sql.types import BinaryType, IntegerType, StringType

    scalar = {np.str_: StringType(), np.int32: IntegerType()}
    return [(name, scalar[dtype] if shape == () else BinaryType())
            for name, dtype, shape in FIELDS]


def make_schema():
    """Build the Unischema (imported lazily: petastorm pulls in pyspark and pyarrow)."""
    from petastorm.codecs import NdarrayCodec, ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField
    from pyspark.sql.types import IntegerType, StringType

    spark_types = {np.str_: StringType(), np.int32: IntegerType()}
    return Unischema("CtsmExample", [
        UnischemaField(name, dtype, shape,
                       ScalarCodec(spark_types[dtype]) if shape == () else NdarrayCodec(), False)
        for name, dtype, shape in FIELDS])


def log_hours(seconds):
    """The time feature used throughout: log1p of a duration in hours (negative clipped to 0)."""
    return np.log1p(np.maximum(np.asarray(seconds, dtype=np.float64), 0.0) / 3600.0).astype(
        np.float32
    )
