"""The Petastorm-free reader gives exactly Petastorm's rows, in Petastorm's order: shuffled and
not, sharded over 1 to 3 ranks, every split, all fields and a subset; and the trainer's batches
are the same under either reader.
This file holds the unit-tier part; the rest is in tests/integration/test_arrow_reader.py."""

from __future__ import annotations

import pytest

from hvd_ctsm.data.arrow_reader import rows_said_damaged, shard_order
from hvd_ctsm.data.batches import DatasetError, reader_name
from tests.helpers import faultlib as fl


def test_shard_order_keeps_each_rank_to_its_own_row_groups():
    """Shuffling changes the order, never which rank reads a row group."""
    for size in (1, 2, 3):
        for seed, shuffle in ((None, False), (3, True), (3, False)):
            orders = [shard_order(10, r, size, seed, shuffle) for r in range(size)]
            assert sorted(sum(orders, [])) == list(range(10))
            assert all(i % size == r for r, order in enumerate(orders) for i in order)
    assert shard_order(10, 0, 1, 3, True) != list(range(10))


def test_an_unknown_reader_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("HVD_CTSM_READER", "parquet")
    with pytest.raises(DatasetError, match="use arrow"):
        reader_name()


def test_a_damaged_page_is_the_files_one_line_and_a_system_error_stays_its_own(tmp_path,
                                                                            monkeypatch):
    """Bytes of a column's pages changed (its size, and so the dataset's file listing, as it
    was): before, a rank crashed mid-training with pyarrow's traceback ("Unexpected end of
    stream"); now the damaged file is its line and exit 2, like any other damage."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hvd_ctsm.data.arrow_reader import RowGroup, read_row_group

    path = tmp_path / "part-00001.parquet"
    pq.write_table(pa.table({"client_id": pa.array(range(5000), pa.int64())}), path)
    group = RowGroup(str(path), 0, 5000)
    assert len(read_row_group(str(tmp_path), group, ["client_id"])) == 5000
    fl.damage_pages(path)
    with pytest.raises(DatasetError, match=rf"^{path}: row group 0 cannot be read \(.+\): the "
                                           r"file is damaged; rebuild the features"):
        read_row_group(str(tmp_path), group, ["client_id"])

    def unreadable(*args, **kwargs):  # the storage's own failure: not called damage
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", unreadable)
    with pytest.raises(OSError, match="Input/output error"):
        read_row_group(str(tmp_path), group, ["client_id"])


def test_rows_said_damaged_passes_the_rows_then_says_the_damage_and_nothing_else():
    """Petastorm's reader decodes row groups inside next(): its pyarrow failure becomes the
    damage's line after the rows before it; an I/O error and an error thrown in by the consumer
    stay their own."""
    import pyarrow as pa

    def rows(failure):
        yield 1
        yield 2
        raise failure

    got = []
    with pytest.raises(DatasetError, match=r"^SPLIT cannot be read \(bad page\): a file is "
                                           r"damaged; rebuild the features"):
        for row in rows_said_damaged(rows(pa.ArrowInvalid("bad page")), "SPLIT",
                                     "a file is damaged"):
            got.append(row)
    assert got == [1, 2]
    with pytest.raises(OSError, match="Input/output error"):
        list(rows_said_damaged(rows(OSError(5, "Input/output error")), "SPLIT", "damaged"))
    said = rows_said_damaged(iter([1, 2]), "SPLIT", "damaged")
    assert next(said) == 1
    with pytest.raises(OSError, match="the consumer's"):
        said.throw(OSError("the consumer's"))


def test_rows_said_damaged_names_the_file_found_only_for_a_damaged_page():
    """Under Petastorm's reader the damaged file is found by reading the shard again
    (`find_damaged`): its line replaces the split's; none found keeps the split's. Another
    dataset error (a build replaced mid-read) is not a damaged page: no search, its own line."""
    import pyarrow as pa

    from hvd_ctsm.data.arrow_reader import DamagedFileError
    from hvd_ctsm.data.pinned import DatasetReplacedError

    def rows(failure):
        yield 1
        raise failure

    searched = []

    def found(named):
        def find():
            searched.append(True)
            return named
        return find

    named = DamagedFileError("F.parquet: row group 3 cannot be read (bad page): ...")
    with pytest.raises(DamagedFileError, match="^F.parquet: row group 3"):
        list(rows_said_damaged(rows(pa.ArrowInvalid("bad page")), "SPLIT", "damaged",
                               found(named)))
    with pytest.raises(DamagedFileError, match=r"^SPLIT cannot be read \(bad page\)"):
        list(rows_said_damaged(rows(pa.ArrowInvalid("bad page")), "SPLIT", "damaged",
                               found(None)))
    assert len(searched) == 2
    with pytest.raises(DatasetReplacedError, match="replaced"):
        list(rows_said_damaged(rows(DatasetReplacedError("replaced")), "SPLIT", "damaged",
                               found(named)))
    assert len(searched) == 2
