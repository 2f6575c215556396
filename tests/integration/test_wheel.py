"""The wheel works where a cluster library would: built from the checkout, installed into a fresh
venv under tmp, used from outside the checkout (presets, the console scripts, doctor).

The venv sees the already installed stack (torch, the built Horovod, Spark) through a .pth line
to this interpreter's site-packages, added after its own: the package itself comes from the
wheel only, never from the checkout or an editable install.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from tests.conftest import REPO

pytestmark = pytest.mark.slow
SOURCES = ["hvd_ctsm", "spark_jobs", "setup.cfg", "pyproject.toml", "README.md"]


def run(cmd, cwd, env: dict | None = None, **kwargs):
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=clean | (env or {}), **kwargs)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a clean copy of the checkout (no stale build/ of its own in it)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
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
    return next((tmp / "dist").glob("hvd_ctsm-*.whl"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; returns its bin folder."""
    tmp = tmp_path_factory.mktemp("installed")
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


# What a Databricks ML runtime already holds, on Python 3.11: 15.4 LTS ML's Spark, pyarrow and
# pandas, numpy 1.26, and a torch (ML runtimes ship one; this machine's stands in for theirs).
RUNTIME_LIKE = ["pyspark==3.5.0", "pyarrow==14.0.1", "pandas==1.5.3", "numpy==1.26.4",
                "torch==2.13.0"]


def would_change(python: Path, wheel: Path, *pip_args) -> tuple[list[str], dict]:
    """pip's own report (--dry-run) of installing the wheel into `python`'s environment: which
    packages already there it would replace (hvd_ctsm itself aside), and the report."""
    proc = run([python, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
                *pip_args, wheel], cwd=wheel.parent)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    payload = json.loads(proc.stdout)
    listed = run([python, "-m", "pip", "list", "--format", "json"], cwd=wheel.parent)
    there = {canonicalize_name(p["name"]) for p in json.loads(listed.stdout)}
    replaced = sorted(f"{item['metadata']['name']} {item['metadata']['version']}"
                      for item in payload["install"]
                      if canonicalize_name(item["metadata"]["name"]) in there - {"hvd-ctsm"})
    return replaced, payload


@pytest.mark.both_stacks
def test_installing_the_wheel_changes_nothing_this_stack_holds(wheel):
    """On whichever stack runs the suite (classic or current): the wheel with its extras
    resolves against what is installed, offline, replacing nothing. (The petastorm extra is
    left out: Petastorm 0.13.1 declares setuptools<70 and torch 2.13 setuptools>=77, so pip can
    resolve no set with both; setup installs Petastorm without its declared dependencies.)"""
    extras = f"{wheel}[mlflow,s3]"
    replaced, payload = would_change(Path(sys.executable), Path(extras), "--no-index")
    assert replaced == [], replaced
    assert [i["metadata"]["name"] for i in payload["install"]] == ["hvd_ctsm"]


@pytest.fixture(scope="module")
def runtime_like() -> Path:
    """A venv holding RUNTIME_LIKE (and what they need) only, built once per machine (minutes
    the first time: PySpark 3.5.0 is a source distribution) into the cache setup uses for
    Horovod's wheel."""
    cache = Path(os.environ.get("HVD_CTSM_CACHE", Path.home() / ".cache" / "hvd_ctsm"))
    key = hashlib.sha256(" ".join(RUNTIME_LIKE).encode()).hexdigest()[:12]
    where = cache / f"runtime-like-{key}"
    if not (where / "bin" / "python").exists():
        building = cache / f"runtime-like-{key}.building-{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)  # a half-built one of this process only
        venv.EnvBuilder(with_pip=True).create(building)
        proc = run([building / "bin" / "python", "-m", "pip", "install", "--quiet",
                    *RUNTIME_LIKE], cwd=cache)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        building.rename(where)  # whole or not at all
    return where / "bin" / "python"


def test_a_runtime_like_environment_keeps_its_packages_and_runs_the_feature_job(
        wheel, runtime_like, tmp_path):
    """`pip install hvd_ctsm` where Spark 3.5.0, pyarrow 14, pandas 1.5 and torch already are:
    pip (its report, resolving against the package index) adds what is missing (tensorboard,
    ...) and replaces nothing there. Then the feature job runs there for real, on those versions,
    and our reader reads back every row it wrote."""
    replaced, payload = would_change(runtime_like, wheel)
    assert replaced == [], replaced
    added = {canonicalize_name(i["metadata"]["name"]) for i in payload["install"]}
    assert {"hvd-ctsm", "tensorboard"} <= added
    site = tmp_path / "site"  # the wheel alone, beside the runtime's own packages
    unpacked = run([runtime_like, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--target", site, wheel], cwd=tmp_path)
    assert unpacked.returncode == 0, unpacked.stderr[-2000:]
    env = {"PYTHONPATH": str(site), "PYTHONWARNINGS": "ignore"}
    out = tmp_path / "features"
    job = run([runtime_like, "-m", "spark_jobs.build_features", "--source",
               "synthetic:clients=40,items=30,events=800,seed=3", "--out", out, "--row-groups",
               "2", "--master", "local[1]"], cwd=tmp_path, env=env)
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
    read = ("import json, sys\nfrom hvd_ctsm.data.arrow_reader import open_arrow_reader\n"
            "from hvd_ctsm.data.batches import split_url\nimport pyspark, pyarrow, pandas\n"
            "with open_arrow_reader(split_url(sys.argv[1], 'train'), 0, 1, None, False) as r:\n"
            "    n = sum(1 for _ in r)\n"
            "print(json.dumps([n, pyspark.__version__, pyarrow.__version__, pandas.__version__]))")
    proc = run([runtime_like, "-c", read, out], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows, *versions = json.loads(proc.stdout)
    assert versions == [v.split("==")[1] for v in RUNTIME_LIKE[:3]]
    assert rows == json.loads((out / "metadata.json").read_text())["splits"]["train"]["rows"] > 0
