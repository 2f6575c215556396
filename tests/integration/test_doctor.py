"""The doctor: every check passes on this machine; a broken pin fails with its fix.
The unit-tier part is in tests/unit/test_doctor.py."""

import json
import os
import subprocess
import sys

import pytest

from hvd_ctsm import doctor


@pytest.mark.horovod
@pytest.mark.spark
def test_every_check_passes_here():
    proc = subprocess.run([sys.executable, "-m", "hvd_ctsm.doctor", "--json"],
                          capture_output=True, text=True, timeout=600)
    report = json.loads(proc.stdout)
    failed = [c for c in report["checks"] if not c["ok"]]
    assert proc.returncode == 0 and not failed, failed
    names = {c["name"] for c in report["checks"]}
    assert {"package pins", "horovod build", "allreduce (gloo, 2 ranks)",
            "allreduce (mpi, 2 ranks)", "java + spark", "petastorm round trip", "backends",
            "allreduce (torch gloo, 2 ranks)"} <= names


@pytest.mark.slow  # doctor's fast checks still start pip check and the Horovod build check
def test_a_bad_pin_fails_with_the_fix(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "constraints.txt"
    bad.write_text("pyarrow==15.0.0\nnumpy==1.26.4\n")
    monkeypatch.setenv("HVD_CTSM_CONSTRAINTS", str(bad))
    code = doctor.main(["--skip-slow"])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL package pins" in out
    assert "pyarrow 10.0.1 (pin 15.0.0)" in out
    assert "fix:" in out and "horovod#3829" in out
    assert "doctor: FAILED: package pins" in out


@pytest.mark.horovod
def test_a_horovod_that_fails_to_load_fails_the_build_check_with_its_error(tmp_path, monkeypatch):
    """The check loads Horovod in a child process: a broken extension is reported, not fatal."""
    broken = tmp_path / "horovod"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        "raise ImportError('C++17 or later compatible compiler is required')\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    check = doctor.check_horovod_build()
    assert not check.ok and check.detail == "missing: PyTorch, MPI, Gloo"
    assert "C++17 or later compatible compiler is required" in check.cause
    assert "./run.sh setup" in check.fix
