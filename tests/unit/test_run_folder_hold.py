"""The run folder's hold (hvd_ctsm.train.run_folder): one `train` at a time in a folder, and
nothing left behind by a run refused before it wrote. Real folders and real flocks; a second
open of the folder stands for another `train` (flocks on two open files conflict in one
process as between two)."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

import pytest

from hvd_ctsm.files import holds, outputs
from hvd_ctsm.train.run_folder import (HELD, check_out_folder, check_run_to_resume, hold_run_folder,
                                       release_run_folder)


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


def test_on_nfs_a_run_folder_is_held_by_a_file_in_it(tmp_path, capsys, folders_not_lockable):
    """An NFS client takes an exclusive flock only on a file open for writing (flock(2)), which
    a folder never is: a second `train` into a run folder there ran beside the first (later,
    with a warning that said so). Now the hold is a file in it, which no check counts as
    content. A stand-in for that mount: flock refusing folders as it does there (EBADF)."""
    out = tmp_path / "run"
    out.mkdir()
    check_out_folder(out, resume=False, overwrite=False, inputs=[])
    assert [p.name for p in out.iterdir()] == [outputs.HOLD]
    with pytest.raises(SystemExit, match=f"another `train` is writing {out} now"):
        hold_run_folder(out, until_released=True)  # another open of it: another process
    with pytest.raises(SystemExit, match="holds no run to continue"):
        check_run_to_resume(str(out))  # the hold file is no run
    release_run_folder(out)
    check_out_folder(out, resume=False, overwrite=False, inputs=[])  # free again
    release_run_folder(out)
    assert capsys.readouterr().err == ""  # guarded: nothing to warn of


def test_on_nfs_overwrite_keeps_the_hold_file_it_holds(tmp_path, folders_not_lockable):
    """--overwrite empties the run folder but for the file its hold is on: removed, the next
    `train` would make another and hold that one beside this run."""
    out = tmp_path / "run"
    out.mkdir()
    outputs.mark(out, "run")
    (out / "config.yaml").write_text("epochs: 1\n")
    check_out_folder(out, resume=False, overwrite=True, inputs=[])
    assert [p.name for p in out.iterdir()] == [outputs.HOLD]
    with pytest.raises(SystemExit, match=f"another `train` is writing {out} now"):
        check_out_folder(out, resume=False, overwrite=True, inputs=[])
    release_run_folder(out)


def test_on_nfs_no_hold_file_is_made_where_a_run_would_not_write(tmp_path, capsys,
                                                                  folders_not_lockable):
    """Not in a user's folder, which is then refused, nor by a check (--check holds nothing);
    and a refused run leaves none of the folders its hold made, the file in them included."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    with pytest.raises(SystemExit, match="not written by hvd_ctsm"):
        check_out_folder(mine, resume=False, overwrite=True, inputs=[])
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    checked = tmp_path / "checked"
    checked.mkdir()
    check_out_folder(checked, resume=False, overwrite=False, inputs=[], hold=False)
    assert list(checked.iterdir()) == []
    typo = tmp_path / "typo" / "a"
    hold_run_folder(typo, until_released=True)
    release_run_folder(typo)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checked", "mine"]
    assert capsys.readouterr().err == ""


def test_on_nfs_another_users_hold_file_is_named_with_its_fix(tmp_path, capsys, monkeypatch,
                                                              folders_not_lockable):
    """A run folder on NFS that another user's `train` held first: its hold file, made in that
    user's umask, is not this user's to open for writing, which NFS's exclusive flock needs.
    The run goes on unguarded and names the file to make writable (before: "cannot lock its
    folders or files (Permission denied)", as if the mount kept no locks). A stand-in besides
    the mount's: os.open refusing that file for writing, as the kernel refuses a user who does
    not own it (the tests run as root, whom it never refuses)."""
    out = tmp_path / "run"
    out.mkdir()
    outputs.mark(out, "run")
    (out / outputs.HOLD).touch()
    real_open = os.open

    def open_as_another_user(path, flags, *args, **kwargs):
        if Path(path).name == outputs.HOLD and flags & os.O_RDWR:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(holds.os, "open", open_as_another_user)
    hold_run_folder(out, until_released=True)
    release_run_folder(out)
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {out} cannot be held: its file system locks only files open for writing, and "
        f"{out / outputs.HOLD} is not this user's to write (make it writable for everyone who "
        "writes here): a second `train` into it at the same moment would not be refused; train "
        "into one --out at a time"]
    assert (out / outputs.HOLD).is_file()  # the other user's, as it was


def test_a_run_folder_where_nothing_can_be_locked_is_said_unguarded_once(tmp_path, capsys,
                                                                         nothing_lockable):
    """An NFS mount without its lock manager locks neither folders nor files (ENOLCK): the run
    goes on unguarded and says so, once. A stand-in for that mount."""
    out = tmp_path / "run"
    out.mkdir()
    check_out_folder(out, resume=False, overwrite=False, inputs=[])  # looks and holds
    assert out in HELD
    release_run_folder(out)
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {out} is on a file system that cannot lock its folders or files (No locks "
        "available): a second `train` into it at the same moment would not be refused; train "
        "into one --out at a time"]
    quiet = tmp_path / "checked"
    quiet.mkdir()
    check_out_folder(quiet, resume=False, overwrite=False, inputs=[], hold=False)
    assert capsys.readouterr().err == ""  # a check holds nothing: nothing to warn of
