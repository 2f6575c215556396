"""The scoring core: each row's top-K items it never had, from a model and history rows.

A row is anything with the feature dataset's serving fields as attributes (a Petastorm row, or
a SimpleNamespace built from plain lists by hvd_ctsm.tracking.pyfunc_input): client_id,
history_len, item, event_type, value, log_gap, client_attrs, client_items, prior_items and
(empty) target arrays. Batch scoring (hvd_ctsm.serving.score, spark_jobs.score_topk) and the
MLflow pyfunc flavour share it; the top-K itself is the model's `recommend` (chunked, seen items
left out: every item the client had, or for a test row scored as the backtest ranks it, only
those before its target).
It imports torch, numpy, hvd_ctsm.data.batches and hvd_ctsm.model.catalog only, so every caller
can import it without a cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch

from hvd_ctsm.model import catalog


def _batch_from_rows(rows: list, max_len: int) -> dict:
    """Padded history tensors; one 'target' per row at its last history position."""
    from hvd_ctsm.data.batches import collate

    batch = collate(rows, max_len)
    lengths = torch.tensor([int(r.history_len) for r in rows])
    batch["target_row"] = torch.arange(len(rows))
    batch["target_pos"] = (lengths - 1).clamp(min=0)
    return batch


def score_rows(model, rows: Iterable, k: int, items: list[str], batch_size: int = 256,
               exclude: str = "client_items") -> Iterator[tuple]:
    """(client_id, rank, item_id, item, score, p_sale) for each row's top-K items outside its
    `exclude` field: `client_items` (every item the client ever had: what to recommend now) or
    `prior_items` (only those before a test row's target: what the backtest ranks among)."""
    max_len = model.sizes.max_len
    table = catalog.item_table(model.encoder)  # every item's vector, once for all the rows
    chunk = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == batch_size:
            yield from _score_chunk(model, chunk, k, items, max_len, table, exclude)
            chunk = []
    if chunk:
        yield from _score_chunk(model, chunk, k, items, max_len, table, exclude)


@torch.no_grad()
def client_states(model, rows: list, max_len: int) -> torch.Tensor:
    """[rows, dim]: each row's state after the last event of its history."""
    batch = _batch_from_rows(rows, max_len)
    return model.states_at(batch)


@torch.no_grad()
def _score_chunk(model, rows: list, k: int, items: list[str], max_len: int,
                 table: torch.Tensor, exclude: str) -> Iterator[tuple]:
    states = client_states(model, rows, max_len)
    top = model.recommend(states, k, [getattr(row, exclude) for row in rows], table)
    p_sale = None
    if "sale" in model.heads:
        expanded = states.unsqueeze(1).expand(-1, top[1].shape[1], -1)
        p_sale = model.p_sale(expanded, top[1]).numpy()
    values, indices = top[0].numpy(), top[1].numpy()
    for i, row in enumerate(rows):
        for rank in range(indices.shape[1]):
            if not np.isfinite(values[i, rank]):
                break  # fewer unseen items than K
            item = int(indices[i, rank])
            yield (str(row.client_id), rank + 1, items[item], item, float(values[i, rank]),
                   None if p_sale is None else float(p_sale[i, rank]))
