"""The feature job on input a real user has: RFC 4180 CSV, a notebook session in another time
zone, and the same input twice (same files, same rows in them). Real local Spark."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.build_features import build_features
from spark_jobs.config import FeatureConfig, parse_time

pytestmark = [pytest.mark.spark, pytest.mark.both_stacks]

ZOE = 'Zoë, "the" client'
MULTI = "two\nlines"


def rfc4180_csv(path: Path) -> None:
    """2 clients x 4 events; one id has a comma and doubled quotes, one a line break."""
    lines = ["client_id,item_id,timestamp,event_type,value"]
    for client in ('"Zoë, ""the"" client"', '"two\nlines"'):
        for day in range(1, 5):
            lines.append(f"{client},i{day},2020-01-0{day}T12:00:00,purchase,")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def serving_rows(out: Path) -> dict:
    table = pq.read_table(out / "serving", columns=["client_id", "timestamp"]).to_pylist()
    return {r["client_id"]: r["timestamp"] for r in table}


def test_rfc4180_csv_in_a_session_of_another_time_zone(spark, tmp_path):
    from hvd_ctsm.data.npy_codec import decode_npy

    events = tmp_path / "events.csv"
    rfc4180_csv(events)
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")  # a notebook's own zone
    try:
        meta = build_features(spark, FeatureConfig(source=f"events:{events}",
                                                   out=str(tmp_path / "out"), row_groups=1))
        assert spark.conf.get("spark.sql.session.timeZone") == "America/New_York"  # restored
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    counts = meta["counts"]
    assert counts["input_rows"] == 8 and counts["used"] == 8  # records, not physical lines
    assert sum(counts["rejected"].values()) == 0 and counts["clients"] == 2
    rows = serving_rows(tmp_path / "out")
    assert set(rows) == {ZOE, MULTI}
    first = decode_npy(rows[ZOE])[0]
    assert first == parse_time("2020-01-01T12:00:00")  # ISO without a zone is UTC


def test_two_identical_runs_write_identical_files(spark, tmp_path):
    source = "synthetic:clients=80,items=40,events=2500,seed=9"
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        build_features(spark, FeatureConfig(source=source, out=str(out), max_len=12,
                                            row_groups=4, max_timestamp=2_000_000_000))
    metas = [json.loads((out / "metadata.json").read_text()) for out in outs]
    for name, split in metas[0]["splits"].items():
        assert split["files"] == metas[1]["splits"][name]["files"]  # names, rows, bytes
        names = [f["name"] for f in split["files"]]
        assert names == [f"part-{i:05d}.parquet" for i in range(len(names))]
        for file in names:
            assert (outs[0] / name / file).read_bytes() == (outs[1] / name / file).read_bytes()


def write_events_parquet(path: Path, client_ids: list) -> None:
    n = len(client_ids)
    pq.write_table(pa.table({"client_id": client_ids, "item_id": [f"i{i % 5}" for i in range(n)],
                             "timestamp": [1_600_000_000 + i for i in range(n)],
                             "event_type": ["purchase"] * n, "value": [1.0] * n}), path)


def test_mixed_parquet_types_stop_in_one_line_naming_column_and_files(spark, tmp_path, capsys):
    from spark_jobs.build_features import main

    events = tmp_path / "events"
    events.mkdir()
    write_events_parquet(events / "a.parquet", list(range(20)))  # client_id int64
    write_events_parquet(events / "b.parquet", [f"c{i}" for i in range(20)])  # string
    before = {f.name: f.read_bytes() for f in events.iterdir()}
    out = tmp_path / "out"
    code = main(["--source", f"events:{events}", "--out", str(out), "--row-groups", "1"])
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    assert err.count("\n") == 1 and "Traceback" not in err and "at org.apache" not in err, err
    assert "'client_id'" in err and "int64 in a.parquet" in err and "string in b.parquet" in err
    assert "rewrite the files with one type" in err
    assert not out.exists() and not list(tmp_path.glob(".out*"))  # nothing written, no stage
    assert {f.name: f.read_bytes() for f in events.iterdir()} == before  # nothing lost


def purchase_log(path: Path, columns: str) -> None:
    """3 clients x 4 purchases, one row without a client; `columns` ends with ',event_type,value'
    or not."""
    five = columns.endswith(",value")
    lines = [columns] + [f"c{c},i{(c + day) % 5},2020-01-0{day}" + (",purchase," if five else "")
                         for c in range(3) for day in range(1, 5)]
    lines.append(",i1,2020-01-01" + (",purchase," if five else ""))
    path.write_text("\n".join(lines) + "\n")


def test_a_purchase_log_without_type_or_value_columns_reads_with_event_type(spark, tmp_path,
                                                                           capsys):
    """A shop's log is often client_id, item_id, timestamp only: it was refused for its missing
    event_type column, with no way to say what its rows are."""
    from spark_jobs.build_features import main

    log, full = tmp_path / "log.csv", tmp_path / "full.csv"
    purchase_log(log, "client_id,item_id,timestamp")
    purchase_log(full, "client_id,item_id,timestamp,event_type,value")
    args = ["--source", f"events:{log}", "--row-groups", "1", "--max-timestamp", "2030-01-01"]
    assert main([*args, "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing column 'event_type'" in err, err
    assert "--event-type purchase" in err  # the fix, in the same line
    assert main([*args, "--out", str(tmp_path / "typed"), "--event-type", "purchase"]) == 0
    assert main(["--source", f"events:{full}", "--row-groups", "1", "--max-timestamp",
                 "2030-01-01", "--out", str(tmp_path / "columns")]) == 0
    capsys.readouterr()
    typed, columns = (json.loads((tmp_path / name / "metadata.json").read_text())
                      for name in ("typed", "columns"))
    assert typed["event_type"] == "purchase" and columns["event_type"] is None
    assert typed["counts"] == columns["counts"]  # every row used or rejected alike
    assert typed["counts"]["rejected"]["null_client_id"] == 1 and typed["counts"]["used"] == 12
    for split in ("train", "validation", "test", "serving"):  # the same dataset, byte for byte
        assert typed["splits"][split]["files"] == columns["splits"][split]["files"]
        for file in typed["splits"][split]["files"]:
            assert ((tmp_path / "typed" / split / file["name"]).read_bytes()
                    == (tmp_path / "columns" / split / file["name"]).read_bytes())
    typed_only = tmp_path / "typed_only.csv"  # event_type, but no value column
    typed_only.write_text(full.read_text().replace(",value", "").replace("purchase,", "purchase"))
    for extra, says in ((["--event-type", "rating"], "--event-type rating needs a value column"),
                        (["--event-type", "view", "--source", f"events:{full}"],
                         "the source has its own event_type column"),
                        (["--source", f"events:{typed_only}"],
                         "missing column 'value' (has: ['client_id', 'event_type', 'item_id', "
                         "'timestamp']): add it, empty where")):
        assert main([*args, "--out", str(tmp_path / "no"), *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("edit, says", [
    (lambda text: text.replace("client_id,item_id,timestamp", "user_id,sku,ts", 1),
     "missing column 'client_id' (has: ['sku', 'ts', 'user_id']): name the source's columns"),
    (lambda text: text.replace(",", ";"),  # a spreadsheet's export in Europe
     "the file is separated by ';': write it with ','"),
    (lambda text: re.sub(r"2020-01-0\d", lambda day: str(parse_time(day[0]) * 1000), text),
     "rejected, most as future_timestamp (12): after --max-timestamp (default now + 1 day): "
     "timestamps in milliseconds"),
], ids=["other-names", "semicolons", "milliseconds"])
def test_a_log_in_another_systems_format_is_one_line_naming_the_fix(spark, tmp_path, capsys,
                                                                     edit, says):
    from spark_jobs.build_features import main

    log = tmp_path / "log.csv"
    purchase_log(log, "client_id,item_id,timestamp")
    log.write_text(edit(log.read_text()))
    assert main(["--source", f"events:{log}", "--event-type", "purchase", "--row-groups", "1",
                 "--max-timestamp", "2030-01-01", "--out", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("when, says", [
    ("1600000000", "too few events a client (3.0 here): a client's last event is its test target"
                   ", the one before its validation target, and a target needs an earlier event"),
    ("2020-01-01", "every timestamp is a whole day, and under --ties strict"),
], ids=["three-events-a-client", "one-day"])
def test_histories_too_short_for_leave_last_out_say_what_a_client_needs(spark, tmp_path, capsys,
                                                                        when, says):
    """Before, 'too little data, bad cutoffs, or timestamps in a format the job does not read'."""
    from spark_jobs.build_features import main

    log = tmp_path / "log.csv"
    step = 1 if when.isdigit() else 0  # seconds apart, or all on one day
    log.write_text("client_id,item_id,timestamp\n" + "".join(
        f"c{c},i{(c + k) % 7},{int(when) + k if step else when}\n"
        for c in range(20) for k in range(3)))
    assert main(["--source", f"events:{log}", "--event-type", "purchase", "--row-groups", "1",
                 "--out", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "split 'train' has no examples" in err and says in err, err
    if step:
        assert "so train targets need clients of 4 or more events" in err


def test_types_spark_reads_as_one_are_not_refused(tmp_path):
    from spark_jobs.parquet_types import check_same_types

    pq.write_table(pa.table({"x": pa.array(["a", "b"]).dictionary_encode()}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": pa.array(["c"], pa.large_string())}), tmp_path / "b.parquet")
    (tmp_path / "_SUCCESS").write_text("")  # hidden from Spark, not a Parquet file
    check_same_types(tmp_path)  # string, dictionary<string> and large_string: all Spark strings


def test_an_unreadable_attribute_time_or_a_repeated_item_is_refused(spark, tmp_path):
    """A client attribute stamped 'notadate' read as null, "known from the start", so it was
    history for every earlier event (future information); a repeated item_id kept whichever
    row Spark read last. Both now stop in one line; an empty timestamp still means the start."""
    from spark_jobs.sources import client_attrs_table, item_attrs_table
    from spark_jobs.validate import SchemaError

    clients = tmp_path / "clients.csv"
    clients.write_text("client_id,timestamp,tier\nc1,,gold\nc2, 2021-03-01 ,gold\nc3,1200,x\n")
    assert client_attrs_table(spark, str(clients)).count() == 3
    clients.write_text("client_id,timestamp,tier\nc1,,gold\nc3,notadate,gold\n")
    with pytest.raises(SchemaError, match="1 row with a timestamp that is neither unix seconds "
                                          "nor an ISO date, e.g. 'notadate' for client 'c3'"):
        client_attrs_table(spark, str(clients))
    items = tmp_path / "items.csv"
    items.write_text("item_id,category\ni1,a\ni2,b\ni1,c\n")
    with pytest.raises(SchemaError, match="1 item_id on more than one row, e.g. 'i1' on 2"):
        item_attrs_table(spark, str(items))


def test_a_csv_folder_reads_only_its_csv_files_and_refuses_headers_in_another_order(spark,
                                                                                   tmp_path):
    """Spark reads every file of a folder by the first one's column order: a file headed
    item_id,client_id,... had its ids swapped (exit 0), and a README beside the CSVs was read
    as events (its second line one more rejected row)."""
    from spark_jobs.sources import read_table
    from spark_jobs.validate import SchemaError

    head = "client_id,item_id,timestamp,event_type,value"
    (tmp_path / "a.csv").write_text(f"{head}\nc1,i1,100,purchase,\nc1,i2,200,purchase,\n")
    (tmp_path / "README.txt").write_text("events of January\nexported by hand\n")
    rows = read_table(spark, str(tmp_path)).collect()
    assert sorted((r.client_id, r.item_id) for r in rows) == [("c1", "i1"), ("c1", "i2")]
    (tmp_path / "b.csv").write_text("item_id,client_id,timestamp,event_type,value\n"
                                    "i3,c2,300,purchase,\n")
    with pytest.raises(SchemaError, match="different headers .* a.csv has client_id,item_id"
                                          ".* b.csv has item_id,client_id"):
        read_table(spark, str(tmp_path))


def test_a_csv_folder_at_a_url_has_its_headers_compared_too(spark, tmp_path, monkeypatch):
    """At a URL (s3a://, abfss://, dbfs:/) the files were not read before Spark read them, and a
    file with its columns in another order had its ids swapped without a word. Their first
    bytes are read through the Hadoop filesystem Spark reads them with; its file:// one here
    (this machine's Spark has no cloud filesystem), nested and quoted as Spark lists them."""
    from spark_jobs import sources
    from spark_jobs.sources import _remote_csv_headers, read_table
    from spark_jobs.validate import SchemaError

    (tmp_path / "day=1").mkdir()
    (tmp_path / "a.csv").write_bytes(b'\xef\xbb\xbfclient_id,"item_id",timestamp\r\nc1,i1,100\r\n')
    (tmp_path / "day=1" / "b.csv").write_text('client_id,item_id,"time\nstamp"\nc2,i2,200\n')
    (tmp_path / "notes.txt").write_text("not input\n")
    url = tmp_path.as_uri()
    headers = _remote_csv_headers(spark, url)
    assert headers == [("a.csv", ["client_id", "item_id", "timestamp"]),
                       ("day=1/b.csv", ["client_id", "item_id", "time\nstamp"])]
    # read_table's route for a URL, with file:// taken as one (as s3a:// would be)
    monkeypatch.setattr(sources.storage, "is_remote", lambda location: True)
    with pytest.raises(SchemaError, match="different headers .* a.csv has client_id,item_id,"
                                          "timestamp, day=1/b.csv has client_id,item_id,time"):
        read_table(spark, url)


def test_compressed_csv_files_are_read_and_checked_as_plain_ones(spark, tmp_path, monkeypatch):
    """A .csv.gz export was read as Parquet: Spark's page of Java and exit 3 for one file, and
    'not a readable Parquet file' for a folder of them."""
    import bz2
    import gzip

    from spark_jobs import sources
    from spark_jobs.sources import SourceError, _remote_csv_headers, read_table
    from spark_jobs.validate import SchemaError

    head = "client_id,item_id,timestamp,event_type,value\n"
    (tmp_path / "a.csv").write_text(f"{head}c1,i1,100,purchase,\n")
    (tmp_path / "b.csv.gz").write_bytes(gzip.compress(f"{head}c2,i2,200,purchase,\n".encode()))
    (tmp_path / "c.csv.bz2").write_bytes(bz2.compress(f"{head}c3,i3,300,purchase,\n".encode()))
    (tmp_path / "notes.txt").write_text("not input\n")
    rows = read_table(spark, str(tmp_path)).collect()
    assert sorted(r.client_id for r in rows) == ["c1", "c2", "c3"]
    assert [r.item_id for r in read_table(spark, str(tmp_path / "b.csv.gz")).collect()] == ["i2"]
    tsv = tmp_path / "one" / "d.tsv.gz"
    tsv.parent.mkdir()
    tsv.write_bytes(gzip.compress(head.replace(",", "\t").encode() + b"c4\ti4\t400\tview\t\n"))
    assert [r.event_type for r in read_table(spark, str(tsv)).collect()] == ["view"]
    assert _remote_csv_headers(spark, tmp_path.as_uri())[1] == ("b.csv.gz", head[:-1].split(","))
    swapped = head.replace("client_id,item_id", "item_id,client_id")
    (tmp_path / "b.csv.gz").write_bytes(gzip.compress(f"{swapped}i2,c2,200,purchase,\n".encode()))
    with pytest.raises(SchemaError, match="different headers .* b.csv.gz has item_id"):
        read_table(spark, str(tmp_path))  # a compressed file's header is compared too
    with monkeypatch.context() as patch:  # and at a URL (file:// taken as one, as s3a:// would)
        patch.setattr(sources.storage, "is_remote", lambda location: True)
        with pytest.raises(SchemaError, match="different headers .* b.csv.gz has item_id"):
            read_table(spark, tmp_path.as_uri())
    (tmp_path / "one" / "cut.csv.gz").write_bytes(gzip.compress(head.encode() * 9)[:30])
    with pytest.raises(SchemaError, match="cut.csv.gz cannot be decompressed"):
        read_table(spark, str(tmp_path / "one" / "cut.csv.gz"))
    (tmp_path / "one" / "events.txt").write_text(head)
    with pytest.raises(SourceError, match="events.txt is not a Parquet file.* by its name: .csv"):
        read_table(spark, str(tmp_path / "one" / "events.txt"))


def test_a_csv_file_mixing_crlf_and_lf_lines_reads_as_one_with_either(spark, tmp_path):
    """Spark ended every record of a file with its first line's ending: after LF lines a CRLF
    line's last field kept its CR (item 'i2\r' beside 'i2', an ISO timestamp rejected), and
    after CRLF lines an LF line was joined to the next record, whose fields were dropped. A
    quoted cell's line break stays data."""
    from spark_jobs import validate
    from spark_jobs.sources import read_table

    head = "client_id,event_type,value,timestamp,item_id"  # the CR stayed in the last field
    records = [("c1", "purchase", None, "2020-01-01", "i1"),
               ("c1", "purchase", None, "2020-01-02T08:00:00", "i2"),
               ("c2", "rating", "4", "2020-01-03", '"two\nlines"'),
               ("c2", "purchase", None, "2020-01-04", "i2")]
    lines = [head, *(",".join(v or "" for v in r) for r in records)]
    expected = sorted(r[:4] + (r[4].strip('"'),) for r in records)
    for first, then in (("\n", "\r\n"), ("\r\n", "\n")):
        path = tmp_path / f"events-{len(first)}.csv"
        path.write_bytes("".join(line + (first, then)[n % 2]
                                 for n, line in enumerate(lines)).encode())
        raw = read_table(spark, str(path))
        assert raw.columns == head.split(",")
        assert sorted(tuple(r) for r in raw.collect()) == expected, repr(first)
        counts = validate.accounting(validate.count_copies(validate.flag_invalid(raw, 2 ** 40)))
        assert counts["used"] == 4 and not sum(counts["rejected"].values()), counts


def test_a_dataset_folder_named_with_a_space_and_a_comma(spark, tmp_path, monkeypatch):
    """--out 'runs/my out' crashed (classic: 'wrote 0 row groups', exit 3; current: 'holds no
    Parquet files'): Spark wrote into a folder named '.my%20out.tmp-*', never cleaned up. Read
    back by the trainer's route, and on the classic stack by Petastorm's reader too."""
    import importlib.util

    from hvd_ctsm.data.batches import open_reader, split_url

    out = tmp_path / "my out,2021-03"
    meta = build_features(spark, FeatureConfig(source="synthetic:clients=40,items=20,events=600",
                                               out=str(out), max_len=20, row_groups=2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my out,2021-03"]  # no stage left
    readers = ["arrow"] + (["petastorm"] if importlib.util.find_spec("petastorm") else [])
    for name in readers:
        monkeypatch.setenv("HVD_CTSM_READER", name)
        with open_reader(split_url(out, "train"), 0, 1, None, False, ["client_id"]) as rows:
            assert len(list(rows)) == meta["splits"]["train"]["rows"] > 0, name


def test_a_time_split_with_no_targets_names_the_datas_time_range(spark, tmp_path):
    """Cutoffs after the last event: the error said 'bad cutoffs' without saying when the
    events are; it names their range now (and metadata.json keeps it for choosing cutoffs)."""
    source = "synthetic:clients=40,items=20,events=600"  # 2020-01-01 onwards
    with pytest.raises(ValueError, match=r"no examples \(600 input rows used; events from "
                                         r"2020-01-0.* UTC, cutoffs 2030-01-01 00:00:00 and"):
        build_features(spark, FeatureConfig(source=source, out=str(tmp_path / "out"), max_len=20,
                                            row_groups=2, split="time",
                                            cutoffs="2030-01-01,2030-02-01"))
    assert not (tmp_path / "out").exists()


def test_dates_for_timestamps_say_what_strict_ties_leave_unscored(spark, tmp_path, capfd):
    """A purchase log with dates only: under strict ties a client whose events share one day has
    no history for its held-out events. The job used to count them silently in a table row; it
    now says how many, and why, and the choice (input order) that keeps them."""
    lines = ["client_id,item_id,timestamp,event_type,value"]
    for c in range(10):  # c0-c5 on days 1, 2, 3, 3; c6-c9 all four on day 1
        days = (1, 2, 3, 3) if c < 6 else (1, 1, 1, 1)
        lines += [f"c{c},i{c + k},2021-03-0{d},purchase," for k, d in enumerate(days)]
    events = tmp_path / "dates.csv"
    events.write_text("\n".join(lines) + "\n")
    common = dict(source=f"events:{events}", row_groups=1)
    strict = build_features(spark, FeatureConfig(out=str(tmp_path / "strict"), **common))
    assert strict["counts"]["whole_day_timestamps"] is True
    # c0-c5 are scored on days 3 and 3 (days 1-2 are history); c6-c9's validation and test
    # events have only same-day events before them, so neither is scored under strict ties
    assert strict["counts"]["clients_without_history"] == {"validation": 4, "test": 4}
    assert strict["counts"]["clients_with_tied_history_only"] == {"validation": 4, "test": 4}
    [tied] = [w for w in strict["warnings"] if w.startswith("--ties strict")]
    assert "every timestamp is a whole day" in tied
    assert "not scored: validation 4 of 10 (40.0%), test 4 of 10 (40.0%);" in tied
    assert "--ties input-order" in tied
    # said where the job runs, a notebook's session as here, not only by the CLI
    assert f"warning: {tied}" in capfd.readouterr().err
    ordered = build_features(spark, FeatureConfig(out=str(tmp_path / "ordered"),
                                                  ties="input-order", **common))
    assert ordered["splits"]["test"]["rows"] == 10
    assert not [w for w in ordered["warnings"] if "ties" in w]
