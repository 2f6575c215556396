"""The run folder's hold (hvd_ctsm.train.run_folder): one `train` at a time in a folder, and
nothing left behind by a run refused before it wrote. Real folders and real flocks; a second
open of the folder stands for another `train` (flocks on two open files conflict in one
process as between two)."""

from __future__ import annotations

import fcntl
import os

import pytest

from hvd_ctsm.files import outputs
from hvd_ctsm.train.run_folder import HELD, check_out_folder, hold_run_folder, release_run_folder


def test_a_refused_run_leaves_none_of_the_folders_its_hold_made(tmp_path):
    """`train --resume --out T/typo/a/b`, refused, left T/typo/a: the hold made the parents
    and its release removed the run folder only."""
    out = tmp_path / "typo" / "a" / "b"
    hold_run_folder(out, until_released=True)
    assert out.is_dir()
    release_run_folder(out)
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_wrote_keeps_its_folders_and_frees_them(tmp_path):
    out = tmp_path / "new" / "run"
    hold_run_folder(out, until_released=True)
    (out / "config.yaml").write_text("epochs: 1\n")
    release_run_folder(out)
    assert (out / "config.yaml").is_file()
    hold_run_folder(out, until_released=True)  # free again: the next run takes it
    release_run_folder(out)


def test_a_folder_a_run_is_writing_is_said_so_before_anything_else(tmp_path):
    """While the running `train` writes its marker (through a temporary file), its folder holds
    no marker: a second `train --overwrite` was told the folder was not ours and to remove it
    ourselves, about a folder a run was training in."""
    out = tmp_path / "run"
    out.mkdir()
    (out / f".{outputs.MARKER}.x1y2.tmp").write_text("")
    running = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(running, fcntl.LOCK_EX)
        with pytest.raises(SystemExit, match=f"another `train` is writing {out} now"):
            check_out_folder(out, resume=False, overwrite=True, inputs=[])
    finally:
        os.close(running)
    assert sorted(p.name for p in out.iterdir()) == [f".{outputs.MARKER}.x1y2.tmp"]


def test_a_run_folder_that_cannot_be_locked_is_said_unguarded_once(tmp_path, capsys,
                                                                   folders_not_lockable):
    """An NFS client takes an exclusive flock only on a file open for writing (flock(2)), and a
    folder cannot be opened so: the run folder went unguarded without a word. A stand-in for
    that mount (none can be made here): flock refusing as it does there (EBADF)."""
    out = tmp_path / "run"
    out.mkdir()
    check_out_folder(out, resume=False, overwrite=False, inputs=[])  # looks and holds
    assert out in HELD
    release_run_folder(out)
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {out} is on a file system that cannot lock folders (Bad file descriptor): a "
        "second `train` into it at the same moment would not be refused; train into one --out "
        "at a time"]
    quiet = tmp_path / "checked"
    quiet.mkdir()
    check_out_folder(quiet, resume=False, overwrite=False, inputs=[], hold=False)
    assert capsys.readouterr().err == ""  # a check holds nothing: nothing to warn of
