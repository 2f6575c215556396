"""A full disk while a step writes: one line naming the file and the way on (exit 3), and no
file left cut short where a later run reads it.

A real "No space left on device" comes from /dev/full here; a write cut short, from a file size
limit (RLIMIT_FSIZE) in a subprocess, which needs no root. tests/integration/test_disk_full.py
fills a real small filesystem under the commands."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from hvd_ctsm.files import outputs
from tests.conftest import REPO


def in_a_subprocess_limited_to(max_bytes: int, code: str) -> subprocess.CompletedProcess:
    """Run `code` where no file may grow past `max_bytes`: a write past it fails (EFBIG) as a
    write to a full disk does, after the bytes that fit."""
    limited = textwrap.dedent(f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of the process
        resource.setrlimit(resource.RLIMIT_FSIZE, ({max_bytes}, {max_bytes}))
    """) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", limited], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_marker_cut_short_leaves_no_marker_and_the_folder_takes_a_run_again(tmp_path):
    """A marker cut short (0 bytes on a full disk) read as none: every later run into the
    folder was refused as not written by hvd_ctsm, --resume and --overwrite too."""
    run = tmp_path / "run"
    proc = in_a_subprocess_limited_to(20, f"""
        from hvd_ctsm.files import outputs
        outputs.claim({str(run)!r}, "run")
    """)
    assert proc.returncode != 0 and "File too large" in proc.stderr
    assert sorted(p.name for p in run.iterdir()) == []  # no marker, no temporary file
    outputs.check_replaceable(run, "run")  # a new run may go there
    outputs.claim(run, "run")
    assert outputs.marker(run)["kind"] == "run"


def test_a_stage_whose_marker_cannot_be_written_is_not_left_behind(tmp_path):
    """Unmarked, remove_stale_temps never took it away: one more .OUT.tmp-* per failed run."""
    out = tmp_path / "features"
    proc = in_a_subprocess_limited_to(20, f"""
        from pathlib import Path
        from hvd_ctsm.files import outputs
        outputs.staging_dir(Path({str(out)!r}), overwrite=False)
    """)
    assert proc.returncode != 0 and "File too large" in proc.stderr
    assert list(tmp_path.iterdir()) == []
