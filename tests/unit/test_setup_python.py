"""setup's choice of Python: each stack takes the Pythons it was verified on, says so in one line
otherwise, and never replaces a venv it finds."""

import os
import re
import subprocess
from pathlib import Path

from hvd_ctsm import doctor

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install_stack.sh"


def fake_python(path: Path, version: str) -> Path:
    """Stands in for an interpreter: setup only asks it for its version before creating a venv."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return path


def setup(tmp_path: Path, stack: str, python: Path | None, venv: Path):
    env = os.environ | {"HVD_CTSM_STACK": stack, "VENV": str(venv), "SKIP_APT": "1",
                        "HVD_CTSM_CACHE": str(tmp_path / "cache")}
    env.pop("PYTHON", None)
    env.pop("HVD_CTSM_BACKENDS", None)
    if python:
        env["PYTHON"] = str(python)
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=60)


def test_the_classic_stack_refuses_a_later_python_before_creating_anything(tmp_path):
    venv = tmp_path / "venv"
    done = setup(tmp_path, "classic", fake_python(tmp_path / "py" / "python3.12", "3.12"), venv)
    assert done.returncode == 1
    assert "is Python 3.12; the classic stack is verified on 3.11" in done.stderr
    assert not venv.exists()


def test_a_venv_of_another_python_is_named_and_left_as_it_is(tmp_path):
    venv = tmp_path / "venv"
    fake_python(venv / "bin" / "python", "3.12")
    (venv / "kept").write_text("a user's file")
    done = setup(tmp_path, "current", fake_python(tmp_path / "py" / "python3.13", "3.13"), venv)
    assert done.returncode == 1
    assert f"{venv} holds Python 3.12, not 3.13" in done.stderr
    assert "remove" in done.stderr and (venv / "kept").read_text() == "a user's file"


def test_setup_and_the_doctor_name_the_same_pythons():
    script = SCRIPT.read_text()
    classic = re.search(r'^PYTHONS="([^"]+)"', script, re.M).group(1).split()
    current = re.search(r'^        PYTHONS="([^"]+)"', script, re.M).group(1).split()
    as_text = {stack: [f"{a}.{b}" for a, b in versions]
               for stack, versions in doctor.VERIFIED_PYTHONS.items()}
    assert as_text == {"classic": classic, "current": current}
