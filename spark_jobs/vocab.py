"""Vocabularies: raw ids to dense indices (0 = padding/unknown), stable across retrains.

New ids are appended in order of decreasing frequency (ties by id) so that a model warm-started
from a previous run keeps every known row of its embedding tables.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from pathlib import Path

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from hvd_ctsm.files.outputs import deployed_version

PAD = "<pad>"
UNKNOWN = "<unknown>"


def extend_vocab(previous: list[str] | None, counts: dict[str, int], head: str) -> list[str]:
    """Previous entries keep their index; unseen keys follow by decreasing count, then key."""
    vocab = list(previous) if previous else [head]
    if vocab[0] != head:
        raise ValueError(f"a previous vocabulary must start with {head!r}, got {vocab[0]!r}")
    known = set(vocab)
    fresh = sorted((k for k in counts if k not in known), key=lambda k: (-counts[k], k))
    return vocab + fresh


# Catalog-sized results come to the driver through toPandas, which moves columns in Arrow batches;
# collect() builds a Row object per row. At 10^6 items the stage took 47-53 s, 72-83 s before.
def collected(df: DataFrame) -> dict[str, list]:
    """`df`'s columns as Python lists, nulls as None (pandas turns a nullable integer column
    into floats with NaN, pandas 3 text nulls into NaN)."""
    frame = df.toPandas()
    return {name: [None if pd.isna(v) else v for v in frame[name].tolist()]
            for name in frame.columns}


def value_counts(df: DataFrame, column: str) -> dict[str, int]:
    counts = collected(df.filter(F.col(column).isNotNull()).groupBy(column).count())
    return dict(zip(counts[column], counts["count"], strict=True))


def vocab_file(path: str) -> Path:
    """A vocab.json, or a folder holding one: a feature dataset, a registry version, or a
    registry (its current version's, the pointer hvd_ctsm.serving.deploy writes)."""
    found = deployed_version(path) or Path(path)
    return found / "vocab.json" if found.is_dir() else found


def load_vocab(path: str | None) -> dict | None:
    if not path:
        return None
    try:
        vocab = json.loads(vocab_file(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"--previous-vocab {path}: no vocab.json there; pass one, or "
                                "the dataset, registry or registry version that holds it") from None
    except ValueError as exc:
        raise ValueError(f"previous vocabulary {path} is not JSON ({exc})") from None
    for key in ("items", "categories", "item_category", "attrs"):
        if key not in vocab:
            raise ValueError(f"previous vocabulary {path} has no {key!r}")
    return vocab


def build_vocab(events: DataFrame, item_attrs, client_attrs, previous: dict | None) -> dict:
    """vocab.json content: items, categories, item_category, tags, item_tags and client
    attribute values.

    events: validated events (item_id); item_attrs: item_id, category, genres[, year] (or None);
    client_attrs: long form client_id, timestamp, name, value (or None).
    """
    previous = previous or {}
    items = extend_vocab(previous.get("items"), value_counts(events, "item_id"), PAD)
    category_of = {}
    if item_attrs is not None:
        rows = collected(item_attrs.filter(F.col("category").isNotNull())
                         .select("item_id", "category"))
        category_of = {item: [category]
                       for item, category in zip(rows["item_id"], rows["category"], strict=True)}
    old_categories = [[c] if c else [] for c in previous.get("item_category", [])]
    categories, labels = index_item_labels(
        items, category_of, previous.get("categories"), previous.get("items", []), old_categories)
    item_category = [label[0] if label else 0 for label in labels]
    tags, item_tags, edges = build_item_tags(items, item_attrs, previous)
    attrs = dict(previous.get("attrs", {}))
    if client_attrs is not None:
        counts = client_attrs.groupBy("name", "value").count().collect()
        by_name: dict[str, dict[str, int]] = {}
        for r in counts:
            if r["value"] is not None:
                by_name.setdefault(r["name"], {})[r["value"]] = r["count"]
        for name in sorted(by_name):
            attrs[name] = extend_vocab(attrs.get(name), by_name[name], UNKNOWN)
    return {
        "items": items,
        "categories": categories,
        "item_category": item_category,
        "tags": tags,
        "item_tags": item_tags,
        "year_edges": edges,
        "attrs": attrs,
    }


# Release years become about this many eras of equal item counts (fewer where one year holds many
# items). Exact years with their decades (about 70 tags on ML-100K, most on a few items) validated
# lower than these eras (benchmarks/results/quality_history.md).
YEAR_ERAS = 10


def year_edges(years: list[int], eras: int = YEAR_ERAS) -> list[int]:
    """The first year of every era but the oldest: quantiles of the known release years."""
    ordered = sorted(years)
    if not ordered:
        return []
    return sorted({ordered[len(ordered) * k // eras] for k in range(1, eras)} - {ordered[0]})


def era_name(year: int, edges: list[int]) -> str:
    """The tag of year's era: "years:1994", "years:1968..1989", open ended at both extremes
    ("years:..1967", "years:1997..")."""
    era = bisect.bisect_right(edges, year)
    first = str(edges[era - 1]) if era > 0 else ""
    last = str(edges[era] - 1) if era < len(edges) else ""
    return f"years:{first}" if first and first == last else f"years:{first}..{last}"


def item_tag_names(genres: str | None, year: int | None, edges: list[int]) -> list[str]:
    """An item's tags: each of its "|"-separated genres ("genre:Drama") and, with a release
    year, its era (era_name); no repeats."""
    names = [f"genre:{g}" for g in (genres or "").split("|") if g]
    if year is not None:
        names.append(era_name(year, edges))
    return list(dict.fromkeys(names))


def build_item_tags(items: list[str], item_attrs, previous: dict) -> tuple[list, list, list]:
    """The tag vocabulary (index 0 = padding), each item's tag indices and the year edges of
    the eras (vocab.json `tags`, `item_tags`, `year_edges`; for model.item_tags). Known tags
    keep their index and a retrain keeps the previous eras; an item absent from this run's
    attributes keeps its old tags."""
    rows = {"item_id": [], "genres": [], "year": []}
    if item_attrs is not None:
        rows = collected(item_attrs.select("item_id", "genres", "year"))
    years = [None if y is None else int(y) for y in rows["year"]]
    # a retrain keeps the eras; a previous run without years set none, so this run may
    edges = previous.get("year_edges") or year_edges([y for y in years if y is not None])
    tags_of = {item: item_tag_names(genres, year, edges)
               for item, genres, year in zip(rows["item_id"], rows["genres"], years, strict=True)}
    tags, item_tags = index_item_labels(items, tags_of, previous.get("tags"),
                                        previous.get("items", []), previous.get("item_tags", []))
    return tags, item_tags, edges


def index_item_labels(items: list[str], labels_of: dict[str, list[str]], names: list | None,
                      previous_items: list[str], previous_labels: list) -> tuple[list[str], list]:
    """A label vocabulary (index 0 = padding; previous `names` keep their index, new labels
    follow by how many items carry them) and each item's label indices. An item absent from
    `labels_of` keeps its labels of the previous run (previous_items, previous_labels)."""
    counts: dict[str, int] = {}
    for item in items[1:]:
        for name in labels_of.get(item, []):
            counts[name] = counts.get(name, 0) + 1
    vocab = extend_vocab(names, counts, PAD)
    index = {name: i for i, name in enumerate(vocab)}
    old = dict(zip(previous_items, previous_labels, strict=False))
    per_item = [[]]
    for item in items[1:]:
        if item in labels_of:
            per_item.append([index[name] for name in labels_of[item]])
        else:
            per_item.append(list(old.get(item, [])))
    return vocab, per_item


def vocab_bytes(vocab: dict) -> bytes:
    """The exact bytes of vocab.json (so `sha256sum vocab.json` equals vocab_sha256)."""
    return (json.dumps(vocab, ensure_ascii=False) + "\n").encode("utf-8")


def vocab_sha256(vocab: dict) -> str:
    return hashlib.sha256(vocab_bytes(vocab)).hexdigest()


def vocab_sizes(vocab: dict) -> dict:
    return {
        "items": len(vocab["items"]),
        "categories": len(vocab["categories"]),
        "attrs": {name: len(values) for name, values in vocab["attrs"].items()},
    }


def index_frame(spark, values: list[str], key: str, index: str) -> DataFrame:
    """(key, index) rows for the non-padding entries, for joins that map raw ids to indices.
    From a list of tuples: built from a pandas frame, the join with 10^6 items was slower
    (10.8-14.0 s against 5.7-11.2 s side by side)."""
    return spark.createDataFrame(
        [(v, i) for i, v in enumerate(values) if i > 0], f"{key} string, {index} int"
    )


def index_items(events: DataFrame, vocab: dict) -> DataFrame:
    """Replace item_id by its vocabulary index `item` (every used item is in the vocabulary)."""
    spark = events.sparkSession
    items = index_frame(spark, vocab["items"], "item_id", "item")
    if len(vocab["items"]) < 2_000_000:  # small enough to ship to every task
        items = F.broadcast(items)
    return events.join(items, "item_id").drop("item_id")
