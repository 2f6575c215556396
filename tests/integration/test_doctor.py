"""The doctor: every check passes on this machine; a broken pin fails with its fix.
The unit-tier part is in tests/unit/test_doctor.py."""

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest

from hvd_ctsm import doctor

pytestmark = pytest.mark.both_stacks


@pytest.mark.spark
def test_every_check_passes_here():
    """On either stack, with nothing set: the doctor finds which one is installed."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HVD_CTSM_STACK", "HVD_CTSM_CONSTRAINTS", "HVD_CTSM_BACKENDS")}
    proc = subprocess.run([sys.executable, "-m", "hvd_ctsm.doctor", "--json"],
                          capture_output=True, text=True, timeout=600, env=env)
    report = json.loads(proc.stdout)
    failed = [c for c in report["checks"] if not c["ok"]]
    assert proc.returncode == 0 and not failed, failed
    checks = {c["name"]: c for c in report["checks"]}
    assert {"package pins", "java + spark", "petastorm round trip", "backends",
            "allreduce (torch gloo, 2 ranks)"} <= set(checks)
    horovod = {"horovod build", "allreduce (gloo, 2 ranks)", "allreduce (mpi, 2 ranks)"}
    if doctor.stack() == "classic":
        assert horovod <= set(checks) and "constraints.txt" in checks["package pins"]["detail"]
    else:  # no Horovod, no Petastorm: their checks are left out or skipped, not failed
        assert not horovod & set(checks) and checks["petastorm round trip"]["skipped"]
        assert "constraints-current.txt" in checks["package pins"]["detail"]


@pytest.mark.slow  # doctor's fast checks still start pip check and the Horovod build check
def test_a_bad_pin_fails_with_the_fix(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "constraints.txt"
    bad.write_text("pyarrow==9.0.0\nnumpy==1.26.4\n")
    monkeypatch.setenv("HVD_CTSM_CONSTRAINTS", str(bad))
    code = doctor.main(["--skip-slow"])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL package pins" in out
    assert f"pyarrow {metadata.version('pyarrow')} (pin 9.0.0)" in out
    if doctor.stack() == "classic":  # the classic pins' known causes
        assert "fix:" in out and "horovod#3829" in out
    else:
        assert "fix:   HVD_CTSM_STACK=current ./run.sh setup installs the pins" in out
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


@pytest.mark.slow
def test_the_torchrun_check_leaves_nothing_in_the_temporary_folder(tmp_path, monkeypatch):
    """Each doctor run left a torchelastic_* folder (torchrun's logs) in the temporary folder."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.delenv("PET_LOG_DIR", raising=False)  # torchrun's --log-dir, if set
    assert doctor.check_torch_allreduce().ok
    assert list(folder.iterdir()) == []
