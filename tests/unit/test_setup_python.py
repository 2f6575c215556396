"""setup's choice of Python: each stack takes the Pythons it was verified on, says so in one line
otherwise, and never replaces a venv it finds; run.sh sets up by itself only into a venv it made
for the same stack."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hvd_ctsm import doctor

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install_stack.sh"


def fake_python(path: Path, version: str) -> Path:
    """Stands in for an interpreter: it answers its version and makes a venv of itself, nothing
    more (setup's pip step then fails)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"""#!/bin/sh
if [ "$1" = -m ] && [ "$2" = venv ]; then
    {shutil.which("mkdir")} -p "$3/bin" && {shutil.which("cp")} "$0" "$3/bin/python"; exit 0
fi
case "$*" in *sys.version_info*) echo {version}; exit 0 ;; esac
exit 1
""")
    path.chmod(0o755)
    return path


def machine_with(tmp_path: Path, versions: list[str]) -> str:
    """A PATH holding only the tools setup calls before pip, and python3.X for each version."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "sed", "date", "mkdir"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    for version in versions:
        fake_python(bin_dir / f"python{version}", version)
    return str(bin_dir)


def stack_env(stack: str, venv: Path) -> dict:
    """This environment for `stack` in `venv`, system packages skipped, no Python asked for."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "HVD_CTSM_BACKENDS")}
    return env | {"HVD_CTSM_STACK": stack, "VENV": str(venv), "SKIP_APT": "1"}


def setup(tmp_path: Path, stack: str, venv: Path, python: Path | None = None,
          path: str | None = None) -> subprocess.CompletedProcess:
    """scripts/install_stack.sh, system packages skipped; PYTHON unset unless `python`."""
    env = stack_env(stack, venv) | {"HVD_CTSM_CACHE": str(tmp_path / "cache")}
    env |= {"PYTHON": str(python)} if python else {}
    env |= {"PATH": path} if path else {}
    return subprocess.run([shutil.which("bash"), str(SCRIPT)], env=env, capture_output=True,
                          text=True, timeout=60)


def test_the_classic_stack_refuses_a_later_python_before_creating_anything(tmp_path):
    venv = tmp_path / "venv"
    done = setup(tmp_path, "classic", venv, fake_python(tmp_path / "py" / "python3.12", "3.12"))
    assert done.returncode == 1
    assert "is Python 3.12; the classic stack is verified on 3.11" in done.stderr
    assert not venv.exists()


def test_a_venv_of_another_python_is_named_and_left_as_it_is(tmp_path):
    venv = tmp_path / "venv"
    fake_python(venv / "bin" / "python", "3.12")
    (venv / "kept").write_text("a user's file")
    done = setup(tmp_path, "current", venv, fake_python(tmp_path / "py" / "python3.13", "3.13"))
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


@pytest.mark.parametrize("versions, chosen", [(["3.12"], "3.12"), (["3.13", "3.12"], "3.12"),
                                              (["3.12", "3.11"], "3.11")])
def test_unset_the_current_stack_takes_the_first_of_its_pythons_found(tmp_path, versions,
                                                                        chosen):
    venv = tmp_path / "venv"
    done = setup(tmp_path, "current", venv, path=machine_with(tmp_path, versions))
    assert "virtual environment" in done.stdout
    assert 'step "pinned Python packages' in done.stderr  # the fake has no pip
    made = subprocess.run([venv / "bin" / "python", "-c", "sys.version_info"],
                          capture_output=True, text=True)
    assert made.stdout.strip() == chosen


def test_unset_with_no_python_of_its_own_the_classic_stack_names_3_11(tmp_path):
    venv = tmp_path / "venv"
    done = setup(tmp_path, "classic", venv, path=machine_with(tmp_path, ["3.12"]))
    assert done.returncode == 1 and "python3.11 not found" in done.stderr
    assert not venv.exists()


def run_sh(venv: Path, stack: str, step: str = "doctor") -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("bash"), str(REPO / "run.sh"), step],
                          env=stack_env(stack, venv),
                          capture_output=True, text=True, timeout=60)


def test_run_sh_never_sets_up_one_stack_into_the_other_stacks_venv(tmp_path):
    """Before: a current-stack venv reached with HVD_CTSM_STACK unset (classic) was 'stale',
    and run.sh installed the classic pins into it (pyarrow 10, numpy 1, Spark 3.5)."""
    venv = tmp_path / "venv"
    fake_python(venv / "bin" / "python", "3.12")
    stamp = venv / ".hvd_ctsm-setup-stamp"
    stamp.write_text("stack=current\nabc\ndef\n")
    for step in ("doctor", "setup"):  # set up by itself first, or asked to
        done = run_sh(venv, "classic", step)
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stderr.strip() == (f"run.sh: {venv} holds the current stack, not the "
                                       "classic one: set HVD_CTSM_STACK=current to use it, or "
                                       "VENV= another folder")
        assert stamp.read_text() == "stack=current\nabc\ndef\n" and "setup" not in done.stdout


def test_run_sh_never_sets_up_into_an_environment_it_did_not_make(tmp_path):
    venv = tmp_path / "env"
    fake_python(venv / "bin" / "python", "3.11")
    done = run_sh(venv, "classic")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"run.sh: {venv} was not made by ./run.sh setup" in done.stderr
    assert sorted(p.name for p in venv.iterdir()) == ["bin"] and "setup" not in done.stdout
