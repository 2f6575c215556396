"""Top-K items from client histories given as plain lists: the MLflow pyfunc flavour's input.

One input row per client (a pandas DataFrame):
    client_id    text or an integer (optional; the row's position when absent or null)
    items        raw item ids (as in the events), oldest first: text, or integers read as
                 their text (as vocab.json holds them), other types refused; ids the model
                 never saw, and nulls, are skipped; only the latest max_len are used. A null
                 or empty list, or one without a known id, gets no items (there is no state
                 to score from); one WARNING per call (logger hvd_ctsm.tracking) counts them
    event_types  optional, one per item: purchase, rating, view or profile (default purchase)
    values       optional, one per item (e.g. the rating; default 0); finite and within
                 +-MAX_EVENT_VALUE (1e15), or the row is refused
    timestamps   optional, unix seconds, one per item: the time gaps (default: no gap)
    <attribute>  optional, one column per client attribute of the training data (e.g. region),
                 its raw value; unknown or absent: the unknown index
One output row per input row, in the same order: client_id, item_ids (the top-K raw ids, best
first, never an item of the client's history) and scores (their next-item logits).
Scoring itself is hvd_ctsm.model.topk's, the same as batch scoring's.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from hvd_ctsm.data.schema import EVENT_TYPE_INDEX, MAX_EVENT_VALUE, log_hours

log = logging.getLogger("hvd_ctsm.tracking")
OUTPUT_COLUMNS = ("client_id", "item_ids", "scores")
OPTIONAL_LISTS = ("event_types", "values", "timestamps")


class HistoryError(MlflowException, ValueError):
    """An input row that cannot be scored; the message names the row and the fix. An
    MlflowException of MLflow's bad-input kind, so that `mlflow models serve` answers 400 with
    it; any other error is its 'unexpected error while evaluating the model', the reason then
    only on the last line of a server-side traceback."""

    def __init__(self, message: str):
        super().__init__(message, error_code=INVALID_PARAMETER_VALUE)


def _as_list(value, what: str, client: str) -> list:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return []
    if isinstance(value, str) or not hasattr(value, "__len__"):
        raise HistoryError(f"client {client}: {what} must be a list (one entry per event), "
                           f"got {type(value).__name__}")
    return list(value)


def _id_text(value, where: str) -> str | None:
    """An id as vocab.json holds it (text); None for a null. Integer ids are read as their
    text, and so are whole floats: a Spark or pandas integer column with a null in it reaches
    the model as floats, NaN for the null."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return str(int(value))
    if isinstance(value, (float, np.floating)) and not np.isnan(value) and value.is_integer():
        return str(int(value))
    if value is None or value is pd.NA or (isinstance(value, (float, np.floating))
                                           and np.isnan(value)):
        return None
    raise HistoryError(f"{where} holds {value!r} ({type(value).__name__}): ids are text or "
                       "integers; cast the column to strings")


def _check_values(given: list, client: str) -> None:
    values = np.asarray(given, dtype=np.float64)
    refused = values[~(np.abs(values) <= MAX_EVENT_VALUE)]  # NaN too: it compares False
    if len(refused):
        raise HistoryError(f"client {client}: `values` must be finite numbers between "
                           f"{-MAX_EVENT_VALUE:g} and {MAX_EVENT_VALUE:g} (larger ones "
                           f"overflow the model's float32 layers); got {refused.tolist()[:3]}")


def _one_history(record: dict, position: int, items: dict, attrs: dict[str, dict],
                 max_len: int) -> SimpleNamespace:
    client = _id_text(record.get("client_id"), f"row {position}: client_id") or str(position)
    raw = [_id_text(item, f"client {client}: items")
           for item in _as_list(record.get("items"), "items", client)]
    columns = {name: _as_list(record.get(name), name, client) for name in OPTIONAL_LISTS}
    for name, values in columns.items():
        if values and len(values) != len(raw):
            raise HistoryError(f"client {client}: {name} has {len(values)} entries for "
                               f"{len(raw)} items; give one per item or leave it out")
    types = [str(t) for t in columns["event_types"]] or ["purchase"] * len(raw)
    unknown = sorted(set(types) - set(EVENT_TYPE_INDEX))
    if unknown:
        raise HistoryError(f"client {client}: unknown event types {unknown}; use "
                           f"{sorted(EVENT_TYPE_INDEX)}")
    _check_values(columns["values"], client)
    known = [i for i, item in enumerate(raw) if item in items][-max_len:]
    times = np.asarray(columns["timestamps"] or [0] * len(raw), dtype=np.int64)[known]
    gaps = log_hours(np.diff(times, prepend=times[:1])) if len(times) else np.zeros(0)
    length = len(known)
    attr_row = [attrs[name].get(str(record.get(name)), 0) for name in attrs]
    empty = np.zeros(0, np.int32)
    index = np.asarray([items[raw[i]] for i in known], dtype=np.int32)
    return SimpleNamespace(
        client_id=client, history_len=length, item=index,
        event_type=np.asarray([EVENT_TYPE_INDEX[types[i]] for i in known], dtype=np.int32),
        value=np.asarray([float(columns["values"][i]) if columns["values"] else 0.0
                          for i in known], dtype=np.float32),
        log_gap=gaps.astype(np.float32),
        client_attrs=np.tile(np.asarray(attr_row, dtype=np.int32), (length, 1)).reshape(
            length, len(attrs)),
        target_pos=empty, target_item=empty, target_label=empty.astype(np.float32),
        target_log_dt=empty.astype(np.float32), prior_items=index, client_items=index)


def history_rows(frame, vocab: dict, meta: dict, max_len: int) -> list[SimpleNamespace]:
    """The DataFrame's rows as scoring rows (hvd_ctsm.model.topk), indexed by the model's
    vocabulary (vocab.json) and attribute names (metadata.json)."""
    if "items" not in frame.columns:
        raise HistoryError(f"the input needs an `items` column (raw item ids, oldest first); "
                           f"it has {list(frame.columns)}")
    items = {str(raw): index for index, raw in enumerate(vocab["items"]) if index > 0}
    attrs = {name: {str(raw): index for index, raw in enumerate(values) if index > 0}
             for name, values in (vocab.get("attrs") or {}).items()
             if name in meta.get("attrs", [])}
    return [_one_history(record, position, items, attrs, max_len)
            for position, record in enumerate(frame.to_dict("records"))]


def _warn_unscorable(rows: list[SimpleNamespace]) -> None:
    """One line for the call, not one per row: a batch of new clients would flood the log."""
    unscorable = [row.client_id for row in rows if row.history_len == 0]
    if unscorable:
        log.warning("%d of %d rows got no recommendations: none of their items is in the "
                    "model's vocabulary (e.g. clients %s)", len(unscorable), len(rows),
                    ", ".join(unscorable[:3]))


def top_k_frame(model, frame, vocab: dict, meta: dict, k: int):
    """One row per input row: client_id, item_ids (top-K raw ids, best first), scores; empty
    lists for a row without a known item, counted in one warning. HistoryError for a row that
    cannot be read (its message names the client and the fix)."""
    from hvd_ctsm.model.topk import score_rows

    if k < 1:
        raise HistoryError(f"k must be >= 1, got {k}")
    rows = history_rows(frame, vocab, meta, model.sizes.max_len)
    _warn_unscorable(rows)
    # Scored by position (client ids may repeat); a row with no known item gets no items.
    scorable = [SimpleNamespace(**vars(row) | {"client_id": str(position)})
                for position, row in enumerate(rows) if row.history_len > 0]
    best: list[tuple[list, list]] = [([], []) for _ in rows]
    for position, _, item_id, _, score, _ in score_rows(model, scorable, k, vocab["items"]):
        best[int(position)][0].append(item_id)
        best[int(position)][1].append(score)
    return pd.DataFrame({"client_id": [row.client_id for row in rows],
                         "item_ids": [ids for ids, _ in best],
                         "scores": [scores for _, scores in best]})
