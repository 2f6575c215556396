"""Per-client examples exactly as hvd_ctsm/data/schema.py describes them, built in a grouped pandas
UDF.

`examples_of_client` is plain numpy on one client's events (unit-testable without Spark);
`build_examples` hashes clients into buckets and runs it on every client of a bucket in one
applyInPandas call, emitting rows already encoded as Petastorm's codecs encode them (what its
dict_to_spark_row produces; Petastorm itself is not needed), plus two bookkeeping columns:
`split` and `n_targets`. A client whose eval target has no earlier event gets a marker row (split
"validation_skipped" or "test_skipped", no data) so the job can count it ("validation_tied",
"test_tied" where its earlier events all share its timestamp). Every client also gets
one "serving" row: its latest events whatever their role, no targets (what batch scoring starts
from).
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from hvd_ctsm.data.schema import EVENT_TYPE_INDEX, FIELDS, SERVING_SPLIT, log_hours, spark_types
from spark_jobs.pandas_frames import object_strings

HISTORY = ("item", "event_type", "value", "timestamp", "log_gap", "client_attrs")
EMPTY = np.zeros(0, np.int32)
NO_TARGETS = np.zeros(0, np.intp)
ROLES = {"train": 1, "validation": 2, "test": 3}  # role codes inside the UDF (0 = input only)
COLUMNS = [name for name, *_ in FIELDS]  # the dataset's columns, in stored order


def add_labels(events: DataFrame, label_min_rating: float) -> DataFrame:
    """event_type -> EVENT_TYPE_INDEX, plus `label`: purchase 1, rating >= threshold, else 0."""
    etype = F.col("event_type")
    label = (
        F.when(etype == "purchase", 1.0)
        .when(etype == "rating", (F.col("value") >= label_min_rating).cast("float"))
        .otherwise(0.0)
    )
    index = F.create_map(*[F.lit(x) for kv in EVENT_TYPE_INDEX.items() for x in kv])[etype]
    return events.withColumn("label", label.cast("float")).withColumn(
        "event_type", index.cast("int")
    )


def _sort_bucket(pdf: pd.DataFrame, n_attrs: int) -> dict:
    """Column arrays of a bucket of clients, sorted by client then EVENT_ORDER (as in split.py)."""
    client = pdf["client_id"].to_numpy(object)
    codes = pd.factorize(client)[0]  # clients need only be contiguous, not sorted by name
    # Input order breaks timestamp ties (split.EVENT_ORDER); frames built by hand have none.
    seq = pdf["input_seq"].to_numpy() if "input_seq" in pdf else np.arange(len(pdf))
    order = np.lexsort((seq, pdf["timestamp"].to_numpy(), codes))  # the last key is the primary one
    attrs = [pdf[f"attr{i}"].to_numpy(np.int32)[order] for i in range(n_attrs)]
    return {
        "client_id": client[order],
        "item": pdf["item"].to_numpy(np.int32)[order],
        "event_type": pdf["event_type"].to_numpy(np.int32)[order],
        "value": pdf["value"].to_numpy(np.float32)[order],
        "timestamp": pdf["timestamp"].to_numpy(np.int64)[order],
        "client_attrs": (np.column_stack(attrs) if n_attrs else np.zeros((len(pdf), 0), np.int32)),
        "label": pdf["label"].to_numpy(np.float32)[order],
        "role": pdf["role"].to_numpy(np.int8)[order],
    }


def _client_view(bucket: dict, start: int, end: int, ties: str = "strict") -> dict:
    """One client's slice of a sorted bucket, plus log_gap and prev (the position whose state
    predicts an event).

    ties="strict": prev is the last position strictly earlier in time, so events with the same
    timestamp never see each other (leakage-safe). ties="input-order": prev is simply the
    previous position, so a tied event that comes first in the input is history for the later
    ones (the protocol of most published sequential-recommendation results)."""
    ev = {name: values[start:end] for name, values in bucket.items() if name != "client_id"}
    ts = ev["timestamp"]
    ev["log_gap"] = log_hours(np.diff(ts, prepend=ts[:1]))
    if ties == "input-order":
        ev["prev"] = np.arange(len(ts)) - 1
    else:
        ev["prev"] = np.searchsorted(ts, ts, side="left") - 1
    return ev


def _row(client_id, ev, start, end, targets, prior=EMPTY, everything=EMPTY) -> dict:
    """One example: history = positions [start, end] of the client's events, `targets` indices."""
    pos = ev["prev"][targets]
    row = {name: ev[name][start : end + 1] for name in HISTORY}
    row.update(
        client_id=str(client_id),
        history_len=np.int32(end + 1 - start),
        target_pos=(pos - start).astype(np.int32),
        target_item=ev["item"][targets],
        target_label=ev["label"][targets],
        target_time=ev["timestamp"][targets],
        target_log_dt=log_hours(ev["timestamp"][targets] - ev["timestamp"][pos]),
        prior_items=prior.astype(np.int32),
        client_items=everything.astype(np.int32),
    )
    return row


def examples_of_client(client_id, ev: dict, max_len: int) -> list[tuple[str, dict | None]]:
    """[(split, example dict or None for a skipped eval client)] from one client's _client_view."""
    out: list[tuple[str, dict | None]] = []
    train = np.flatnonzero((ev["role"] == ROLES["train"]) & (ev["prev"] >= 0))
    if len(train):
        pos = ev["prev"][train]
        last = int(pos.max())
        window = (last - pos) // max_len  # windows end at `last` and go back in steps of L
        for w in np.unique(window):
            end = last - int(w) * max_len
            start = max(0, end - max_len + 1)
            out.append(("train", _row(client_id, ev, start, end, train[window == w])))
    everything = np.unique(ev["item"])
    for split in ("validation", "test"):
        for j in np.flatnonzero(ev["role"] == ROLES[split]):
            p = int(ev["prev"][j])
            if p < 0:  # "tied": its earlier events share its timestamp (strict ties)
                out.append((f"{split}_skipped" if j == 0 else f"{split}_tied", None))
                continue
            prior = np.unique(ev["item"][: p + 1])
            row = _row(client_id, ev, max(0, p - max_len + 1), p, np.array([j]), prior, everything)
            out.append((split, row))
            if np.isin(ev["item"][j], prior):  # counted: the evaluation ranks it last
                out.append((f"{split}_repeat", None))
    out.append((SERVING_SPLIT, serving_row(client_id, ev, max_len, everything)))
    return out


def serving_row(client_id, ev: dict, max_len: int, everything: np.ndarray) -> dict:
    """The client's last `max_len` events, every role included (no time cutoff: scoring wants
    the newest state), no targets; all items it ever had are both prior and client items."""
    end = len(ev["item"]) - 1
    return _row(client_id, ev, max(0, end - max_len + 1), end, NO_TARGETS, everything, everything)


def bucket_examples(pdf: pd.DataFrame, n_attrs: int, max_len: int, ties: str = "strict"):
    """Examples of every client in a bucket (one pandas call serves many clients: the per-call
    overhead of grouped pandas UDFs is milliseconds, far more than one client's work)."""
    bucket = _sort_bucket(pdf, n_attrs)
    client = bucket["client_id"]
    bounds = np.concatenate([[0], np.flatnonzero(client[1:] != client[:-1]) + 1, [len(client)]])
    out = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end > start:
            view = _client_view(bucket, start, end, ties)
            out += examples_of_client(client[start], view, max_len)
    return out


def client_examples(
    client_id, pdf: pd.DataFrame, max_len: int, ties: str = "strict"
) -> list[tuple[str, dict | None]]:
    """One client's examples from a frame with role names and an `attrs` list column (tests)."""
    n_attrs = len(pdf["attrs"].iloc[0]) if len(pdf) else 0
    frame = pdf.drop(columns="attrs").assign(
        client_id=client_id, role=pdf["role"].map(ROLES).fillna(0).astype(np.int8)
    )
    for i in range(n_attrs):
        frame[f"attr{i}"] = [a[i] for a in pdf["attrs"]]
    return bucket_examples(frame, n_attrs, max_len, ties)


def output_schema() -> T.StructType:
    fields = [T.StructField("split", T.StringType()), T.StructField("n_targets", T.IntegerType())]
    fields += [T.StructField(name, data_type, True) for name, data_type in spark_types()]
    return T.StructType(fields)


_HEADERS: dict = {}


def npy_bytes(array: np.ndarray) -> bytes:
    """Exactly petastorm's NdarrayCodec.encode (np.save bytes), with the header cached by dtype and
    shape: np.save's header formatting dominates the cost for short arrays."""
    array = np.ascontiguousarray(array)
    key = (array.dtype.str, array.shape)
    header = _HEADERS.get(key)
    if header is None:
        buffer = io.BytesIO()
        np.save(buffer, array)
        header = buffer.getvalue()[: buffer.tell() - array.nbytes]
        if len(_HEADERS) < 100_000:
            _HEADERS[key] = header
    return header + array.tobytes()


def encode_row(row: dict) -> list:
    """Field values in stored order, encoded as Petastorm's codecs encode them: arrays as np.save
    bytes (dtype and rank checked), strings as str, ints as int."""
    values = []
    for name, dtype, shape in FIELDS:
        value = row[name]
        if shape:
            if value.dtype != dtype or value.ndim != len(shape):
                raise ValueError(f"{name}: {value.dtype}{value.shape} does not fit the schema's "
                                 f"{np.dtype(dtype)} with {len(shape)} dimension(s)")
            value = npy_bytes(value)
        elif dtype is np.str_:
            if not isinstance(value, str):
                raise ValueError(f"{name}: expected a string, got {type(value).__name__}")
        else:
            value = int(value)
        values.append(value)
    return values


def encode_examples(examples: list[tuple[str, dict | None]]) -> pd.DataFrame:
    fields = COLUMNS
    records = []
    for split, row in examples:
        if row is None:
            records.append([split, 0] + [None] * len(fields))
        else:
            records.append([split, len(row["target_item"])] + encode_row(row))
    return pd.DataFrame(records, columns=["split", "n_targets"] + fields)


def build_examples(
    events: DataFrame, max_len: int, n_attrs: int, buckets: int, ties: str = "strict"
) -> DataFrame:
    """events (client_id, item, event_type, value, timestamp, label, role, attrs) -> rows.

    Clients are hashed into `buckets` groups; each group is one pandas call."""
    role = F.coalesce(
        F.create_map(*[F.lit(x) for kv in ROLES.items() for x in kv])[F.col("role")], F.lit(0)
    )
    data = events.select(
        "client_id",
        "item",
        "event_type",
        "value",
        "timestamp",
        "label",
        "input_seq",
        role.cast("byte").alias("role"),
        *[F.col("attrs")[i].alias(f"attr{i}") for i in range(n_attrs)],
        F.pmod(F.xxhash64("client_id"), F.lit(buckets)).alias("bucket"),
    )

    def per_bucket(pdf):
        return object_strings(encode_examples(bucket_examples(pdf, n_attrs, max_len, ties)))

    return data.groupBy("bucket").applyInPandas(per_bucket, output_schema())
