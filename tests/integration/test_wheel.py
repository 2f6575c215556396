"""The wheel works where a cluster library would: built from the checkout, installed into a fresh
venv under tmp, used from outside the checkout (presets, the console scripts, doctor).

The venv sees the already installed stack (torch, the built Horovod, Spark) through a .pth line
to this interpreter's site-packages, added after its own: the package itself comes from the
wheel only, never from the checkout or an editable install.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow
SOURCES = ["hvd_ctsm", "spark_jobs", "setup.cfg", "pyproject.toml", "README.md"]


def run(cmd, cwd, **kwargs):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=env, **kwargs)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; returns its bin folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a clean copy: no stale build/ of the checkout's own in the wheel
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "--no-index", "-w", tmp / "dist", source], cwd=tmp)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    wheel = next((tmp / "dist").glob("hvd_ctsm-*.whl"))
    venv.EnvBuilder(with_pip=False).create(tmp / "venv")
    bin_dir = tmp / "venv" / "bin"
    purelib = run([bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_path("
                   "'purelib'))"], cwd=tmp).stdout.strip()
    (Path(purelib) / "zz_stack.pth").write_text(sysconfig.get_path("purelib") + "\n")
    install = run([sys.executable, "-m", "pip", "--python", bin_dir / "python", "install",
                   "--no-deps", "--no-index", wheel], cwd=tmp)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    return bin_dir


def test_the_wheel_ships_the_presets_and_loads_them_outside_the_checkout(installed, tmp_path):
    code = ("import hvd_ctsm, hvd_ctsm.config as c; cfg = c.load_config('default', ['epochs=1']);"
            " print(hvd_ctsm.__file__); print(c.preset_names()); print(cfg.epochs, "
            "c.load_config('sasrec').model.dim)")
    proc = run([installed / "python", "-c", code], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    where, presets, values = proc.stdout.splitlines()
    assert where.startswith(str(installed.parent)) and not where.startswith(str(REPO))
    assert {"default", "ml100k", "sasrec"} <= set(eval(presets))
    assert values == "1 50"  # sasrec.yaml read from the wheel


def test_the_console_scripts_run_from_the_wheel(installed, tmp_path):
    helped = run([installed / "hvd-ctsm", "train", "--help"], cwd=tmp_path)
    assert helped.returncode == 0 and "--print-config" in helped.stdout, helped.stderr[-2000:]
    printed = run([installed / "hvd-ctsm", "train", "--config", "sasrec", "--print-config"],
                  cwd=tmp_path)
    assert printed.returncode == 0 and "batch_size: 128" in printed.stdout, printed.stderr
    refused = run([installed / "hvd-ctsm-train", "--data", tmp_path, "epochs=3.7"], cwd=tmp_path)
    assert refused.returncode != 0 and "epochs=3.7 has the wrong type" in refused.stderr


def test_doctor_runs_from_the_wheel_without_constraints_txt(installed, tmp_path):
    proc = run([installed / "hvd-ctsm", "doctor", "--json", "--skip-slow"], cwd=tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["package versions"]["ok"], checks["package versions"]
    assert "requirements of the installed hvd_ctsm are met" in checks["package versions"]["detail"]
