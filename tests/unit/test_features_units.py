"""Unit tests of the feature job's pure functions (pandas/numpy ones need no Spark)."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest

from hvd_ctsm.data.schema import EVENT_TYPE_INDEX, log_hours
from spark_jobs.config import FeatureConfig, parse_time
from spark_jobs.sequences import client_examples
from spark_jobs.vocab import era_name, extend_vocab, item_tag_names, year_edges
from spark_jobs.write import file_starts


def client_frame(ts, roles, items=None, n_attrs=1):
    n = len(ts)
    items = items if items is not None else list(range(1, n + 1))
    return pd.DataFrame(
        {
            "item": np.array(items, np.int32),
            "event_type": np.full(n, EVENT_TYPE_INDEX["rating"], np.int32),
            "value": np.full(n, 4.0),
            "timestamp": np.array(ts, np.int64),
            "label": np.ones(n, np.float32),
            "role": roles,
            "attrs": [np.arange(n_attrs, dtype=np.int32) + i for i in range(n)],
        }
    )


def assert_time_safe(row):
    for pos, t in zip(row["target_pos"], row["target_time"], strict=True):
        assert (row["timestamp"][: pos + 1] < t).all()
    assert (np.diff(row["timestamp"]) >= 0).all()


def test_training_windows_end_at_last_needed_position():
    ts = list(range(0, 1000, 100))  # 10 events, distinct times
    roles = ["train"] * 8 + ["validation", "test"]
    out = client_examples("c", client_frame(ts, roles), max_len=3)
    train = [r for s, r in out if s == "train"]
    # targets are events 1..7 with target_pos 0..6; last needed input = 6; windows [4,6] [1,3] [0,0]
    spans = sorted((int(r["timestamp"][0]), r["history_len"]) for r in train)
    assert spans == [(0, 1), (100, 3), (400, 3)]
    assert sum(len(r["target_item"]) for r in train) == 7
    for r in train:
        assert_time_safe(r)
        assert len(r["prior_items"]) == 0 and len(r["client_items"]) == 0
        assert r["client_attrs"].shape == (r["history_len"], 1)
    latest = max(train, key=lambda r: r["timestamp"][0])
    assert list(latest["target_pos"]) == [0, 1, 2] and list(latest["target_item"]) == [6, 7, 8]


def test_eval_rows_one_target_last_l_events_and_item_sets():
    ts = [0, 10, 20, 30, 40]
    items = [5, 6, 5, 7, 8]
    out = dict(
        client_examples("c", client_frame(ts, ["train"] * 3 + ["validation", "test"], items), 2)
    )
    test = out["test"]
    assert list(test["timestamp"]) == [20, 30] and list(test["target_pos"]) == [1]
    assert list(test["target_item"]) == [8]
    assert list(test["prior_items"]) == [5, 6, 7]
    assert list(test["client_items"]) == [5, 6, 7, 8]
    np.testing.assert_allclose(test["target_log_dt"], log_hours([10]))
    np.testing.assert_allclose(test["log_gap"], log_hours([10, 10]))
    assert list(out["validation"]["prior_items"]) == [5, 6]


def test_tied_timestamps_never_leak():
    ts = [0, 50, 50, 50, 90, 90]
    out = client_examples("c", client_frame(ts, ["train"] * 4 + ["validation", "test"]), 200)
    rows = dict((s, r) for s, r in out if s != "train")
    train = [r for s, r in out if s == "train"]
    assert sum(len(r["target_pos"]) for r in train) == 3  # events 1, 2, 3 all predicted from 0
    assert list(train[0]["target_pos"]) == [0, 0, 0]
    # validation and test share a time: test's history stops before both
    assert list(rows["test"]["timestamp"]) == [0, 50, 50, 50]
    assert list(rows["validation"]["timestamp"]) == [0, 50, 50, 50]
    for r in [*train, *rows.values()]:
        assert_time_safe(r)


def test_input_order_ties_make_the_earlier_tied_event_history():
    ts = [0, 50, 50, 90]
    frame = client_frame(ts, ["train"] * 3 + ["test"], items=[4, 9, 7, 2])
    strict = dict((s, r) for s, r in client_examples("c", frame, 200) if s != "serving")
    ordered = dict(
        (s, r) for s, r in client_examples("c", frame, 200, ties="input-order") if s != "serving"
    )
    # item 7 comes after item 9 in the input at the same time: only input-order shows it 9
    assert list(strict["train"]["target_item"]) == [9, 7]
    assert list(strict["train"]["target_pos"]) == [0, 0]
    assert list(ordered["train"]["target_pos"]) == [0, 1]
    assert list(ordered["train"]["item"][: 1 + 1]) == [4, 9]
    # the test target's history holds the whole tied group under both rules (both are earlier)
    assert list(strict["test"]["item"]) == list(ordered["test"]["item"]) == [4, 9, 7]
    assert_time_safe(strict["train"])


def test_input_order_decides_the_sequence_order_of_tied_events():
    frame = client_frame([0, 50, 50, 90], ["train"] * 3 + ["test"], items=[4, 9, 7, 2])
    swapped = frame.iloc[[0, 2, 1, 3]].reset_index(drop=True)  # 7 before 9 in the input
    test = dict(client_examples("c", swapped, 200, ties="input-order"))["test"]
    assert list(test["item"]) == [4, 7, 9]


def test_client_with_no_earlier_event_is_skipped_and_a_tie_says_so():
    out = client_examples("c", client_frame([7, 7], ["validation", "test"]), 10)
    # the test event has an earlier event, at its own timestamp: under strict ties, no history
    assert out[:2] == [("validation_skipped", None), ("test_tied", None)]
    # it still gets a serving row: scoring needs no earlier event
    assert [s for s, _ in out[2:]] == ["serving"] and list(out[2][1]["timestamp"]) == [7, 7]


def test_serving_row_holds_the_latest_events_of_every_role_and_no_targets():
    from spark_jobs.sequences import COLUMNS, encode_row

    ts = [0, 10, 20, 30, 40, 50]
    items = [5, 6, 5, 7, 8, 9]
    roles = ["train"] * 3 + ["validation", "test", None]  # the last one: input only (time split)
    out = client_examples("c", client_frame(ts, roles, items), 3)
    serving = [r for s, r in out if s == "serving"]
    assert len(serving) == 1
    row, test = serving[0], dict(out)["test"]
    assert list(row["timestamp"]) == [30, 40, 50] and list(row["item"]) == [7, 8, 9]
    assert row["history_len"] == 3 and row["client_attrs"].shape == (3, 1)
    assert list(test["timestamp"]) == [10, 20, 30]  # the test row still stops before its target
    np.testing.assert_allclose(row["log_gap"], log_hours([10, 10, 10]))
    for name in ("target_pos", "target_item", "target_label", "target_time", "target_log_dt"):
        assert len(row[name]) == 0
    assert list(row["client_items"]) == list(row["prior_items"]) == [5, 6, 7, 8, 9]
    assert len(encode_row(row)) == len(COLUMNS)  # dtypes and ranks fit the schema


def test_collate_takes_targets_only_from_rows_that_have_them():
    from types import SimpleNamespace

    import torch

    from hvd_ctsm.data.batches import collate

    ts = [0, 10, 20, 30]
    out = dict(client_examples("c", client_frame(ts, ["train", "train", "validation", "test"]), 8))
    rows = [SimpleNamespace(**out["serving"]), SimpleNamespace(**out["test"])]
    batch = collate(rows, 8)
    assert batch["target_row"].tolist() == [1] and batch["target_item"].tolist() == [4]
    assert batch["item"][0, :4].tolist() == [1, 2, 3, 4]  # the serving row: every event
    assert batch["item"][1].tolist() == [1, 2, 3, 0]  # the test row: before 4, padded to 4
    assert batch["target_pos"].dtype == batch["target_item"].dtype == torch.int64
    serving_only = collate(rows[:1], 8)
    assert serving_only["target_row"].numel() == serving_only["target_item"].numel() == 0


def test_extend_vocab_keeps_old_indices_and_appends_by_frequency():
    old = ["<pad>", "b", "a"]
    new = extend_vocab(old, {"a": 1, "c": 5, "d": 9, "e": 5}, "<pad>")
    assert new == ["<pad>", "b", "a", "d", "c", "e"]
    with pytest.raises(ValueError):
        extend_vocab(["x"], {}, "<pad>")


def test_release_years_become_eras_of_about_equal_size():
    years = [1950, 1960, 1970, 1980] + [1995] * 4 + [1996, 1997]
    edges = year_edges(years, eras=5)
    assert edges == [1970, 1995, 1996]  # a year never splits: 1995 is one era, not two
    assert [era_name(y, edges) for y in (1922, 1969, 1970, 1994, 1995, 1996, 2030)] == [
        "years:..1969", "years:..1969", "years:1970..1994", "years:1970..1994",
        "years:1995", "years:1996..", "years:1996.."]
    assert year_edges([]) == [] and year_edges([2001] * 5) == []
    assert era_name(2001, []) == "years:.."  # one era: the tag says only "the year is known"
    assert item_tag_names("Drama|Crime|Drama", 1995, [1990]) == [
        "genre:Drama", "genre:Crime", "years:1990.."]
    assert item_tag_names(None, None, [1990]) == [] and item_tag_names("", 1980, []) == [
        "years:.."]


def test_config_validation_and_time_parsing():
    assert parse_time("1970-01-02") == 86400
    assert parse_time("86400") == 86400
    cfg = FeatureConfig(
        source="movielens:x", out="o", split="time", cutoffs=("1970-01-02", "200000")
    )
    assert cfg.cutoffs == (86400, 200000)
    assert FeatureConfig(source="movielens:x", out="o", split="time",  # as --cutoffs takes them
                         cutoffs="1970-01-02,200000").cutoffs == (86400, 200000)
    for bad in (
        dict(split="time"),
        dict(split="time", cutoffs=(5, 3)),
        dict(split="time", cutoffs="1970-01-02"),
        dict(split="random"),
        dict(max_len=0),
        dict(row_groups=0),
        dict(source="kafka:x"),
        dict(source="synthetic:items=abc"),  # said before Spark starts
        dict(cutoffs=(1, 2)),
        dict(source="events:x", event_type="buy"),
        dict(source="synthetic:clients=10", event_type="purchase"),  # it says its own types
    ):
        with pytest.raises(ValueError):
            FeatureConfig(**{"source": "movielens:x", "out": "o", **bad})


def test_fast_encoding_matches_petastorm_codecs():
    pytest.importorskip("petastorm", reason="compares with Petastorm's codecs (classic stack)")
    from petastorm.unischema import dict_to_spark_row

    from hvd_ctsm.data.schema import make_schema
    from spark_jobs.sequences import encode_row, npy_bytes

    for array in (
        np.arange(5, dtype=np.int32),
        np.zeros((3, 0), np.int32),
        np.ones((4, 3), np.int32),
        np.zeros(0, np.float32),
        np.arange(7, dtype=np.int64),
    ):
        assert npy_bytes(array) == npy_bytes(array.copy())
        buffer = io.BytesIO()
        np.save(buffer, array)
        assert npy_bytes(array) == buffer.getvalue()
    ts = [0, 10, 20, 30]
    rows = client_examples("c9", client_frame(ts, ["train", "train", "validation", "test"]), 200)
    schema = make_schema()
    for _, row in rows:
        expected = [
            bytes(v) if isinstance(v, bytearray) else v for v in dict_to_spark_row(schema, row)
        ]
        assert encode_row(row) == expected
    bad = dict(rows[0][1], item=rows[0][1]["item"].astype(np.int64))
    with pytest.raises(ValueError, match="item"):
        encode_row(bad)


def test_the_field_table_is_petastorms_unischema():
    """schema.FIELDS (what the Petastorm-free writer and reader use) declares what the Unischema
    does: the same columns in the same stored order, the same Spark types, dtypes and shapes."""
    pytest.importorskip("petastorm", reason="compares with Petastorm's Unischema (classic stack)")
    from hvd_ctsm.data.schema import FIELDS, make_schema, spark_types

    unischema = make_schema()
    assert [name for name, *_ in FIELDS] == list(unischema.fields)
    assert [(f.name, f.dataType) for f in unischema.as_spark_schema().fields] == spark_types()
    for name, dtype, shape in FIELDS:
        field = unischema.fields[name]
        assert (field.numpy_dtype, field.shape) == (dtype, shape), name


def test_text_columns_reach_spark_as_python_objects():
    """pandas 3 makes text pyarrow-backed strings, which PySpark 4.3 cannot take from a pandas
    UDF; object_strings turns them (and only them) into object columns."""
    import pandas as pd

    from spark_jobs.pandas_frames import object_strings

    frame = pd.DataFrame({"id": pd.Series(["a", "b"], dtype="string[pyarrow]"),
                          "n": [1, 2], "kept": pd.Series(["x", "y"], dtype=object)})
    out = object_strings(frame)
    assert out["id"].dtype == object and list(out["id"]) == ["a", "b"]
    assert out["n"].dtype == frame["n"].dtype and out["kept"].dtype == object
    plain = frame.drop(columns="id")
    assert object_strings(plain) is plain


def test_file_starts_name_the_client_and_rank_of_each_files_first_row():
    """The split writer's plan: file f starts at the first row i (in row order) with
    i * files // n == f; checked against every row numbered one by one."""
    rng = np.random.default_rng(5)
    for _ in range(300):
        counts = rng.integers(1, 6, size=int(rng.integers(1, 30))).tolist()
        clients = [f"c{i:03d}" for i in range(len(counts))]
        rows = [(c, rank) for c, k in zip(clients, counts, strict=True) for rank in range(k)]
        n = len(rows)
        files = int(rng.integers(1, n + 1))
        first = {}
        for i, row in enumerate(rows):
            first.setdefault(i * files // n, row)
        assert file_starts(clients, counts, files) == [first[f] for f in range(1, files)]


def test_previous_vocab_is_a_file_or_the_folder_that_holds_it(tmp_path):
    """--previous-vocab REGISTRY said '[Errno 21] Is a directory', after every event was read."""
    from spark_jobs.vocab import load_vocab

    content = {"items": ["<pad>", "i1"], "categories": ["<pad>"], "item_category": [0, 0],
               "attrs": {}}
    version = tmp_path / "registry" / "v0001"
    version.mkdir(parents=True)
    (version / "vocab.json").write_text(json.dumps(content))
    (tmp_path / "registry" / "current").write_text("v0001\n")
    for given in (version / "vocab.json", version, tmp_path / "registry"):
        assert load_vocab(str(given)) == content
    with pytest.raises(FileNotFoundError, match="--previous-vocab .*: no vocab.json there"):
        load_vocab(str(tmp_path / "nothing"))


def test_a_spark_setting_without_an_equals_sign_is_argparses_one_line(capsys):
    """--conf foo was "dictionary update sequence element #0 has length 1; 2 is required"."""
    from spark_jobs.build_features import parse_args

    args = parse_args(["--source", "synthetic:clients=10", "--out", "o", "--conf",
                       "spark.driver.memory=8g", "--conf", "spark.x= a=b"])
    assert dict(args.conf) == {"spark.driver.memory": "8g", "spark.x": " a=b"}
    with pytest.raises(SystemExit) as stop:
        parse_args(["--source", "synthetic:clients=10", "--out", "o", "--conf", "foo"])
    assert stop.value.code == 2
    assert "argument --conf: 'foo' is not KEY=VALUE" in capsys.readouterr().err


def test_one_cutoff_is_named_as_given():
    """--cutoffs abc said 'needs cutoffs', as if none had been given."""
    with pytest.raises(ValueError, match="needs two cutoffs=\\(T1, T2\\) \\(got 'abc'\\)"):
        FeatureConfig(source="synthetic:clients=10", out="o", split="time", cutoffs="abc")


def test_the_line_endings_of_a_csv_files_records_are_told_outside_quoted_fields(tmp_path,
                                                                               monkeypatch):
    """Only a file that ends records with both CRLF and LF is read with LF as the line ending
    (spark_jobs.csv_files): an Excel file (CRLF, a cell's LF in quotes) is read as before."""
    from spark_jobs import csv_files

    cases = {b'a,b\r\n"x\ny",1\r\n"p""\r\nq",2\r\n': {csv_files.CRLF},
             b'a,b\nx,1\r\ny,2\n': {csv_files.CRLF, csv_files.LF},
             b'a,b\r"x\r\ny",1\r': {csv_files.CR}}
    for chunk in (1 << 20, 1, 2, 3):  # a CRLF or a quote at a chunk's edge
        monkeypatch.setattr(csv_files, "CHUNK", chunk)
        for n, (text, endings) in enumerate(cases.items()):
            (tmp_path / f"{n}.csv").write_bytes(text)
            assert csv_files.record_endings(tmp_path / f"{n}.csv") == endings, (chunk, text)
    assert csv_files.line_options([tmp_path / "0.csv", tmp_path / "2.csv"]) == {}
    assert csv_files.line_options([tmp_path / "0.csv", tmp_path / "1.csv"])["lineSep"] == "\n"
    from spark_jobs.validate import SchemaError

    # A file of CR-ended lines beside a mixing one would be one record under LF: refused
    with pytest.raises(SchemaError, match=r"1.csv ends its lines with CRLF and LF both, and "
                                          r".*2.csv with CR alone"):
        csv_files.line_options([tmp_path / "0.csv", tmp_path / "1.csv", tmp_path / "2.csv"])


def test_a_missing_id_column_is_named_with_the_sources_own_columns_and_the_fix():
    from spark_jobs.validate import SchemaError, check_id_columns

    check_id_columns(["timestamp", "item_id", "client_id"])  # any order, nothing said
    for columns, says in (([], "has: none: an empty file"),
                          (["user_id", "item_id", "timestamp"], "in a CSV's header"),
                          (["client_id;item_id;timestamp"], "separated by ';'"),
                          (["client_id\titem_id\ttimestamp"], "separated by '\\t'"),
                          (["client_id|item_id|timestamp"], "separated by '|'")):
        with pytest.raises(SchemaError, match="missing column 'client_id'") as caught:
            check_id_columns(columns)
        assert says in str(caught.value), caught.value


def test_many_rejected_rows_are_one_warning_naming_the_main_reason_and_its_fix():
    from spark_jobs.summary import REJECTED_SHARE_TO_WARN, rejected_rows_warning

    def counts(rejected: dict) -> dict:
        return {"input_rows": 1000, "rejected": {"bad_timestamp": 0, "duplicate": 0, **rejected}}

    few = int(REJECTED_SHARE_TO_WARN * 1000) - 1
    assert rejected_rows_warning(counts({"duplicate": few})) is None  # a log's stray rows
    assert rejected_rows_warning({"input_rows": 0, "rejected": {"duplicate": 0}}) is None
    line = rejected_rows_warning(counts({"future_timestamp": 300, "duplicate": 20}))
    assert line.startswith("320 of 1,000 input rows (32.0%) were rejected, most as "
                           "future_timestamp (300): ") and "milliseconds" in line, line
    line = rejected_rows_warning(counts({"out_of_range_value": 60}))
    assert line.endswith("most as out_of_range_value (60)"), line  # no hint: the count says it


def test_a_files_name_says_how_it_is_read():
    from spark_jobs.csv_files import is_csv, separator

    assert [separator(n) for n in ("a.csv", "A.CSV.GZ", "a.tsv.bz2", "a.tsv", "a.parquet",
                                   "a.gz", "a.txt", "csv")] == [",", ",", "\t", "\t", None,
                                                                None, None, None]
    assert [is_csv(n) for n in ("a.csv", "a.csv.gz", "a.csv.bz2", "a.tsv", "a.csv.zip",
                                "README")] == [True, True, True, False, False, False]


def test_events_before_1980_are_one_warning_naming_the_units_that_land_there():
    from spark_jobs.summary import early_events_warning

    assert early_events_warning({"first_event": parse_time("1997-09-20")}) is None  # MovieLens
    assert early_events_warning({"first_event": None}) is None  # no event used
    line = early_events_warning({"first_event": 20200103})  # 2020-01-03 as yyyymmdd
    assert line.startswith("the earliest event is at 1970-08-22 19:08:23 UTC") and (
        "yyyymmdd numbers" in line), line


def test_a_held_out_target_of_an_item_the_client_had_is_counted_and_many_are_a_warning():
    from spark_jobs.summary import REPEAT_SHARE_TO_WARN, repeat_targets_warning

    ts = [0, 10, 20, 30, 40]
    out = client_examples("c", client_frame(ts, ["train"] * 3 + ["validation", "test"],
                                            items=[5, 6, 7, 6, 8]), 200)
    assert [s for s, _ in out if s.endswith("_repeat")] == ["validation_repeat"]  # 6 again

    def meta(repeats: int, source: str = "events:log.csv") -> dict:
        return {"source": source, "splits": {"test": {"targets": 1000}},
                "counts": {"repeat_targets": {"validation": 0, "test": repeats}}}

    assert repeat_targets_warning(meta(int(REPEAT_SHARE_TO_WARN * 1000) - 1)) is None
    assert repeat_targets_warning(meta(400, "synthetic:clients=10")) is None  # documented
    line = repeat_targets_warning(meta(400))
    assert line.startswith("400 of 1,000 test targets (40.0%) are items their client had before")
    assert line.endswith("(HR@10 at most 60.0% here)"), line
