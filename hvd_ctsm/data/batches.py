"""Reading the feature job's datasets (Parquet in Petastorm's layout): one rank's shard, batched
and padded. Rows come from hvd_ctsm.data.arrow_reader (pyarrow alone: it reads on current stacks
where Petastorm cannot, 1.6x faster on ML-100K), or from Petastorm's own reader where it is
installed and HVD_CTSM_READER=petastorm; both give the same rows in the same order.

Both shard by row group (row group i goes to rank i % size). Ranks must run the same number
of steps or the allreduce hangs, so the plan is made from the Parquet footers before training:
every rank takes min(rows in any shard) // batch_size batches per epoch. With balance='targets'
a batch is the next rows up to a target budget instead of batch_size rows: the work of a step
(the heads score every target) is then about the same on every rank. With balance='length'
batches hold rows of similar history length (see length_grouped), and since a batch is padded
only to its longest history, a step computes over less padding. Row groups and rows are
shuffled with seeds derived from (seed, epoch), so the order is reproducible and a resumed run
skips exactly the batches it already trained on.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

# The dataset's header is read in hvd_ctsm.data.dataset_meta (no torch); its names are this module's
# too (`as` re-exports them), beside the readers that use them.
from hvd_ctsm.data.dataset_meta import DatasetError as DatasetError
from hvd_ctsm.data.dataset_meta import DatasetMeta as DatasetMeta
from hvd_ctsm.data.dataset_meta import check_same_vocabulary as check_same_vocabulary
from hvd_ctsm.data.dataset_meta import read_metadata as read_metadata
from hvd_ctsm.data.pinned import failure_said_as_replaced, pin_split, rows_of_the_pinned_build
# Importing the schema also quiets Petastorm's deprecation warnings.
from hvd_ctsm.data.schema import EVENT_TYPES  # noqa: F401

HISTORY_FIELDS = ("item", "event_type", "value", "log_gap")
TARGET_FIELDS = ("target_pos", "target_item", "target_label", "target_log_dt")


def verify_split(data_dir: str | Path, name: str, meta: DatasetMeta | None = None) -> None:
    """Every Parquet file metadata.json lists for split `name` is there with its size and row
    count, and no other is; else DatasetError naming the file. Reads only the footers.
    Datasets written before the listing existed are not checked."""
    from hvd_ctsm.files import storage
    split = (meta or read_metadata(data_dir)).splits.get(name, {})
    if "files" in split:
        folder = storage.join(data_dir, split.get("path", name))
        fix = f"rebuild the features into a new folder ({data_dir} is damaged or incomplete)"
        found = storage.parquet_sizes(folder)
        for listed in split["files"]:
            file = storage.join(folder, listed["name"])
            if listed["name"] not in found:
                raise DatasetError(f"{file} is missing ({listed['rows']} of the {split['rows']} "
                                   f"rows metadata.json lists for {name!r}): {fix}")
            size = found[listed["name"]]
            try:
                rows = storage.parquet_rows(file) if size == listed["bytes"] else -1
            except storage.StorageError:
                raise
            except Exception as exc:  # noqa: BLE001  any unreadable footer means damaged
                raise DatasetError(f"{file} is unreadable ({exc}): {fix}") from exc
            if size != listed["bytes"] or rows != listed["rows"]:
                raise DatasetError(f"{file} changed since it was written ({size} bytes, listed "
                                   f"{listed['bytes']}; {listed['rows']} rows listed): {fix}")
        extra = sorted(set(found) - {f["name"] for f in split["files"]})
        if extra:
            raise DatasetError(f"{folder} holds files metadata.json does not list ({extra}): "
                               f"{fix}")


_VERIFIED: set[tuple] = set()  # (dataset, split, build) checked by this process


def split_url(data_dir: str | Path, split: str, meta: DatasetMeta | None = None) -> str:
    """The split's URL for Petastorm, after checking its files once per process and build
    (verify_split): every reader (trainer, backtest, scoring) opens splits through here. A local
    folder becomes a file:// URL, its split pinned to the build `meta` (the one the step read;
    default: read now) describes (hvd_ctsm.data.pinned); a remote dataset URL (s3://, hdfs://,
    ...) is used as it is."""
    from hvd_ctsm.files import storage
    meta = meta or read_metadata(data_dir)
    if storage.is_remote(data_dir):  # s3://, hdfs://, ...: Petastorm reads it through fsspec
        key, url, pin = str(data_dir).rstrip("/"), storage.join(data_dir, split), None
    else:
        folder = storage.local_path(data_dir).resolve()
        key, url = str(folder), (folder / split).as_uri()
        pin = pin_split(folder, split, meta)
    if (key, split, pin and pin.sha256) not in _VERIFIED:
        # files of another build than `meta` lists: say the dataset was replaced
        with failure_said_as_replaced(pin and pin.check, DatasetError):
            verify_split(data_dir, split, meta)
        _VERIFIED.add((key, split, pin and pin.sha256))
    if pin:  # the files checked may be another build's that lists the same ones
        pin.check()
    return url


def reader_name() -> str:
    """Which reader opens splits: "arrow" (hvd_ctsm.data.arrow_reader, the default: it needs only
    pyarrow and reads the same rows in the same order) or "petastorm" (its make_reader, where it
    is installed and HVD_CTSM_READER=petastorm asks for it)."""
    name = os.environ.get("HVD_CTSM_READER", "arrow")
    if name not in ("arrow", "petastorm"):
        raise DatasetError(f"HVD_CTSM_READER={name!r}: use arrow (the default) or petastorm")
    if name == "petastorm" and importlib.util.find_spec("petastorm") is None:
        raise DatasetError("HVD_CTSM_READER=petastorm, but Petastorm is not installed: unset it "
                           "(the default reader needs none) or pip install 'hvd_ctsm[petastorm]'")
    return name


def _row_group_sizes(url: str) -> list[int]:
    """Rows per row group, in the order both readers number them."""
    from hvd_ctsm.data.arrow_reader import row_groups

    return [group.rows for group in row_groups(url)]


def shard_rows(url: str, size: int) -> list[int]:
    """Rows in each of `size` shards."""
    sizes = _row_group_sizes(url)
    if len(sizes) < size:
        raise DatasetError(f"{url} has {len(sizes)} row groups, fewer than {size} "
                           f"rank{'s' * (size != 1)}: some ranks would get no rows; rebuild it "
                           "with --row-groups >= ranks")
    return [sum(sizes[r::size]) for r in range(size)]


def shard_target_counts(url: str, size: int) -> list[np.ndarray]:
    """Targets of every row, shard by shard (only the target_pos column is read)."""
    counts = []
    for rank in range(size):
        with open_reader(url, rank, size, seed=None, shuffle=False,
                         fields=["target_pos"]) as reader:
            counts.append(np.array([len(row.target_pos) for row in reader], np.int64))
    return counts


@dataclass
class EpochPlan:
    steps: int  # batches per rank per epoch, the same on every rank
    rows_per_shard: list[int]
    target_budget: int = 0  # balance='targets': a batch's rows hold at least this many targets
    targets_per_shard: list[int] | None = None
    by_length: bool = False  # balance='length': batches of similar history length


def plan_epoch(url: str, size: int, batch_size: int, balance: str = "rows") -> EpochPlan:
    rows = shard_rows(url, size)
    steps = min(rows) // batch_size
    if steps == 0:
        raise DatasetError(f"the smallest shard of {url} has {min(rows)} rows, less than one "
                           f"batch of {batch_size}: lower data.batch_size or use fewer ranks")
    if balance in ("rows", "length"):
        return EpochPlan(steps=steps, rows_per_shard=rows, by_length=balance == "length")
    counts = shard_target_counts(url, size)
    totals = [int(c.sum()) for c in counts]
    largest_row = max(int(c.max()) for c in counts)
    # A batch closes once it holds >= budget targets, so it uses < budget + largest_row of them:
    # with this budget every shard has enough targets for `steps` batches in any order.
    budget = min(totals) // steps - largest_row
    if budget < 1:
        raise DatasetError(f"{url}: too few targets per shard for data.balance=targets with "
                           f"{steps} steps per epoch: use data.balance=rows")
    return EpochPlan(steps=steps, rows_per_shard=rows, target_budget=budget,
                     targets_per_shard=totals)


def _next_batch(rows: Iterator, batch_size: int, target_budget: int) -> list:
    """The next batch_size rows, or with a target budget the next rows holding >= budget
    targets."""
    if not target_budget:
        return list(itertools.islice(rows, batch_size))
    chunk, targets = [], 0
    for row in rows:
        chunk.append(row)
        targets += len(row.target_pos)
        if targets >= target_budget:
            return chunk
    return []  # ran out


# Evaluation, and training with balance='length', sort this many batches' rows by history length
# at a time: enough for batches of alike lengths, few enough that a large shard is never held in
# memory whole.
LENGTH_POOL_BATCHES = 32


def length_grouped(rows: Iterator, steps: int, batch_size: int,
                   order_rng: np.random.Generator) -> Iterator[list]:
    """`steps` batches, LENGTH_POOL_BATCHES x batch_size rows (in their shuffled order) at a
    time: a pool's rows sorted by history length and cut into as many batches as it holds
    batch_size rows, each with about the same number of targets (many short histories or a
    few long ones), taken in an order drawn from `order_rng`.

    Equal targets keep every target's weight in the loss (a batch's mean) what it is in
    random batches, and a step's cost (about the tokens it holds) the same. Every rank draws
    the same order, so at each step the ranks' batches are alike and neither waits long for
    the other at the allreduce. A pool uses exactly the rows that row batches would."""
    for start in range(0, steps, LENGTH_POOL_BATCHES):
        count = min(LENGTH_POOL_BATCHES, steps - start)
        pool = list(itertools.islice(rows, count * batch_size))
        if len(pool) < count * batch_size:
            return  # ran out: the caller reports it
        pool.sort(key=lambda row: int(row.history_len))  # stable: ties keep the shuffled order
        cuts = equal_target_cuts([len(row.target_pos) for row in pool], count)
        for b in order_rng.permutation(count):
            yield pool[cuts[b]:cuts[b + 1]]


def equal_target_cuts(targets: list[int], parts: int) -> list[int]:
    """Boundaries 0 = c0 < c1 < ... < c_parts = len(targets) splitting `targets` (counts per
    row, in order) into `parts` runs of consecutive rows with about equal sums, every run at
    least one row."""
    cumulative = np.cumsum(targets)
    ideal = cumulative[-1] * np.arange(1, parts) / parts
    cuts = [0]
    for k, at in enumerate(np.searchsorted(cumulative, ideal, side="left") + 1, start=1):
        cuts.append(int(min(max(at, cuts[-1] + 1), len(targets) - (parts - k))))
    return cuts + [len(targets)]


def collate(rows: list, max_len: int) -> dict[str, torch.Tensor]:
    """Right-pad histories to the batch's longest (at most max_len); flatten targets with the
    row they belong to. Padding sits after every real event and the encoder is causal, so the
    width changes no state, only how much padding a step computes over."""
    n = len(rows)
    width = max(1, min(max_len, max(int(row.history_len) for row in rows)))
    batch = {"item": np.zeros((n, width), np.int64),
             "event_type": np.zeros((n, width), np.int64),
             "value": np.zeros((n, width), np.float32),
             "log_gap": np.zeros((n, width), np.float32)}
    n_attrs = rows[0].client_attrs.shape[1] if rows[0].client_attrs.ndim == 2 else 0
    batch["client_attrs"] = np.zeros((n, width, n_attrs), np.int64)
    for i, row in enumerate(rows):
        length = int(row.history_len)
        for name in HISTORY_FIELDS:
            batch[name][i, :length] = getattr(row, name)
        if n_attrs:
            batch["client_attrs"][i, :length] = row.client_attrs
    counts = [len(row.target_item) for row in rows]
    batch["target_row"] = np.repeat(np.arange(n), counts)
    for name in TARGET_FIELDS:
        batch[name] = np.concatenate([getattr(row, name) for row in rows])
    out = {k: torch.from_numpy(v) for k, v in batch.items()}
    out["target_pos"] = out["target_pos"].long()
    out["target_item"] = out["target_item"].long()
    return out


def _shuffled(rows: Iterator, buffer_size: int, rng: np.random.Generator) -> Iterator:
    """Streaming shuffle through a buffer of buffer_size rows (0: no shuffling)."""
    if buffer_size <= 1:
        yield from rows
        return
    buffer = []
    for row in rows:
        buffer.append(row)
        if len(buffer) >= buffer_size:
            yield buffer.pop(int(rng.integers(len(buffer))))
    rng.shuffle(buffer)
    yield from buffer


@contextmanager
def open_reader(url: str, rank: int, size: int, seed: int | None, shuffle: bool,
                fields: list[str] | None = None):
    """This rank's shard (all columns, or only `fields`), read row group by row group in the
    calling thread, by the reader `reader_name()` names; rows have the schema's fields as
    attributes. Overlap with compute comes from `prefetch`."""
    if reader_name() == "arrow":
        from hvd_ctsm.data.arrow_reader import open_arrow_reader

        with open_arrow_reader(url, rank, size, seed, shuffle, fields) as rows:
            yield rows
        return
    with _open_petastorm_reader(url, rank, size, seed, shuffle, fields) as reader:
        yield reader


@contextmanager
def _open_petastorm_reader(url: str, rank: int, size: int, seed: int | None, shuffle: bool,
                           fields: list[str] | None = None):
    """Petastorm's "dummy" pool, not its thread pool: with 0.13.1's thread pool we saw an epoch
    end after 0 rows in about 1 read in 12 (a race between its ventilator and the result queue),
    and its order is not reproducible with more than one thread."""
    from petastorm import make_reader

    from hvd_ctsm.data.arrow_reader import damaged_group_said, rows_said_damaged
    from hvd_ctsm.data.npy_codec import use_fast_decoding
    from hvd_ctsm.files import storage

    split = url if storage.is_remote(url) else storage.local_path(url)  # as the user named it
    # bound to the URL as given (the arrow reader's form), before Petastorm's replaces it
    find_damaged = partial(damaged_group_said, url, rank, size, seed, fields)
    if not storage.is_remote(url):  # Petastorm takes a file: URL's "%20" literally
        url = f"file://{storage.local_path(url)}"
    reader = make_reader(url, schema_fields=fields, cur_shard=rank, shard_count=size,
                         num_epochs=1, shuffle_row_groups=shuffle, seed=seed,
                         reader_pool_type="dummy")
    use_fast_decoding(reader.schema)  # np.load's header parsing dominated reading (npy_codec)
    rows = reader if storage.is_remote(url) else rows_of_the_pinned_build(
        reader, storage.local_path(url))
    try:  # Petastorm does not say which file failed: read the shard again to find it
        yield rows_said_damaged(rows, f"{split}: a row group of rank {rank}'s shard",
                                "one of its files is damaged", find_damaged)
    finally:
        # Not `with reader`: its exit also runs cleanup_cache(), which prints "Cache cleanup
        # complete." once per rank per epoch; we use no disk cache, so stop and join suffice.
        reader.stop()
        reader.join()


def train_batches(url: str, rank: int, size: int, epoch: int, plan: EpochPlan, batch_size: int,
                  max_len: int, seed: int, shuffle_buffer: int = 1024,
                  skip: int = 0) -> Iterator[dict[str, torch.Tensor]]:
    """Exactly plan.steps - skip batches of this rank's shard for one epoch."""
    epoch_seed = seed * 100_003 + epoch + 1  # petastorm treats seed 0 as "not seeded"
    rng = np.random.default_rng([seed, epoch, rank])
    with open_reader(url, rank, size, epoch_seed, shuffle=True) as reader:
        rows = _shuffled(iter(reader), shuffle_buffer, rng)
        if plan.by_length:  # the same order on every rank: not seeded by rank
            batches = length_grouped(rows, plan.steps, batch_size,
                                     np.random.default_rng([seed, epoch]))
        else:
            batches = iter(lambda: _next_batch(rows, batch_size, plan.target_budget), None)
        rows_vary = plan.by_length or plan.target_budget > 0
        for step in range(plan.steps):
            chunk = next(batches, [])
            if not chunk or (len(chunk) < batch_size and not rows_vary):
                raise DatasetError(f"rank {rank}: shard of {url} ran out after {step} batches, "
                                   f"{plan.steps} were planned: the dataset changed under the run?")
            if step >= skip:
                yield collate(chunk, max_len)


def prefetch(batches: Iterator, depth: int) -> Iterator:
    """Produce batches in a background thread, `depth` ahead of the consumer (0: inline).

    The thread starts now, not at the first next(): a caller can open the next epoch's reader
    (and fill its shuffle buffer) while it still validates or checkpoints the current one.
    Reading and decoding Parquet releases the GIL for much of its time, so this overlaps data
    loading with the forward and backward passes. Errors are re-raised in the consumer.
    """
    if depth <= 0:
        return iter(batches)
    done = object()
    box: queue.Queue = queue.Queue(maxsize=depth)

    def produce():
        try:
            for item in batches:
                box.put(item)
            box.put(done)
        except BaseException as exc:  # noqa: BLE001  handed to the consumer thread
            box.put(exc)

    threading.Thread(target=produce, daemon=True, name="prefetch").start()
    return _consume(box, done)


def _consume(box: queue.Queue, done: object) -> Iterator:
    while (item := box.get()) is not done:
        if isinstance(item, BaseException):
            raise item
        yield item


def eval_batches(url: str, rank: int, size: int, batch_size: int, max_len: int):
    """Every row of this rank's shard once, with the ranking extras: the rows of every
    LENGTH_POOL_BATCHES batches (in file order) sorted by history length, so that a batch pads
    to little more than its rows' own lengths. Metrics do not depend on the order (a client's
    sampled negatives are seeded by its id)."""
    with open_reader(url, rank, size, seed=None, shuffle=False) as reader:
        rows = iter(reader)
        while pool := list(itertools.islice(rows, LENGTH_POOL_BATCHES * batch_size)):
            pool.sort(key=lambda row: int(row.history_len))
            for start in range(0, len(pool), batch_size):
                yield _eval_collate(pool[start:start + batch_size], max_len)


def _eval_collate(rows: list, max_len: int) -> dict:
    batch = collate(rows, max_len)
    batch["client_id"] = [str(row.client_id) for row in rows]
    batch["prior_items"] = [np.asarray(row.prior_items) for row in rows]
    batch["client_items"] = [np.asarray(row.client_items) for row in rows]
    return batch
