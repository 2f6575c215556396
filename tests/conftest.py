"""Shared fixtures (the real MovieLens 100K folder, one local Spark session per test run) and
the test tiers.

Tiers are markers: `spark` (a local Spark session), `horovod` (real Horovod workers: horovodrun,
horovod.spark), `slow`
(seconds to minutes: subprocesses, wheels, Docker), `faults` (injected failures), `e2e` (a whole
chain through a user's entry point), `cluster` (a Spark standalone cluster) and `unit`, which this
file gives every test that has none of the first three and uses no Spark or dataset fixture: pure
Python and torch in this process, seconds in all. `pytest --fast` (`./run.sh test --fast`) runs
the unit tier only; plain `pytest` runs every tier, as CI does.

Two markers name a part only the classic stack has: `horovod` and `petastorm` (Petastorm's own
reader or writer). Where that part is not installed (the current stack) their tests are skipped,
each saying why.

The folders are the same map: `tests/unit` holds unit-tier tests only, `tests/integration` (real
Spark, datasets, workers, entry points at 2 ranks) and `tests/cluster` (a Spark standalone
cluster) none; collection stops on a test in the wrong folder. `tests/helpers`: what tests import
or start (fault injection, worker scripts).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY_MARKERS = {"spark", "horovod", "slow"}
HEAVY_FIXTURES = {"spark", "tiny_features", "ml100k"}
CLASSIC_ONLY = {"horovod": "Horovod", "petastorm": "Petastorm"}  # marker -> the part it needs
# ./run.sh from a test runs this interpreter's venv as the stack it holds (only the classic stack
# has Horovod), also when the tests were started without ./run.sh test's HVD_CTSM_STACK.
RUN_SH_ENV = {"VENV": sys.prefix, "HVD_CTSM_STACK": os.environ.get("HVD_CTSM_STACK") or (
    "classic" if importlib.util.find_spec("horovod") else "current")}
# The suite's Spark JVMs live seconds to minutes: C1 alone and the serial collector spend far
# less CPU compiling and collecting than the JVM's server defaults. Side by side here, the
# feature job took 37-42 s of CPU instead of 57-63 on tiny data, 48 instead of 70 on ML-100K and
# 69 instead of 117 on 420k events (200k items). For every Spark driver the tests start
# (spark-submit reads SPARK_SUBMIT_OPTS, PySpark's gateway too) and the standalone daemons.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("SPARK_SUBMIT_OPTS", TEST_JVM_OPTIONS)
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", TEST_JVM_OPTIONS)


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help="run the unit tier only (no Spark, Horovod or slow tests)")
    parser.addoption("--heavy", action="store_true",
                     help="run every tier but the unit tier (what ./run.sh test runs second)")


def is_unit(item) -> bool:
    return not (HEAVY_MARKERS & {m.name for m in item.iter_markers()}
                or HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())))


def pytest_collection_modifyitems(config, items):
    misplaced = [item.nodeid for item in items
                 if (Path(item.path).parent.name == "unit") != is_unit(item)]
    if misplaced:
        raise pytest.UsageError("tests/unit holds the unit tier only, and it holds all of it; "
                                "move these: " + ", ".join(misplaced))
    missing = {m: name for m, name in CLASSIC_ONLY.items() if importlib.util.find_spec(m) is None}
    for item in items:
        if is_unit(item):
            item.add_marker(pytest.mark.unit)
        needs = [name for m, name in missing.items() if item.get_closest_marker(m)]
        if needs:
            item.add_marker(pytest.mark.skip(reason=f"needs {' and '.join(needs)}: the classic "
                                             "stack (HVD_CTSM_STACK=classic ./run.sh setup)"))
    for option, keep in (("--fast", is_unit), ("--heavy", lambda item: not is_unit(item))):
        if config.getoption(option):
            skipped = [item for item in items if not keep(item)]
            items[:] = [item for item in items if keep(item)]
            config.hook.pytest_deselected(items=skipped)


def ml100k_dir() -> Path:
    """MovieLens 100K lives beside the checkout (its license forbids a copy in the repo)."""
    return Path(os.environ.get("ML100K_DIR", REPO.parent / "shared" / "data" / "ml-100k"))


# Programs the tests start and stop leave files in the temporary folder that they never remove:
# a CI run once left in /tmp two of Spark's TorchDistributor folders (a cancelled rank's
# train.py and output.pickle: its torchrun finished after Spark killed the task's worker), an
# Open MPI session folder, torchrun's torchelastic_* logs (about 40), torch's cache folder and
# pytest's own. So the whole run gets a temporary folder of its own (TMPDIR, which the xdist
# workers and every program they start inherit), removed when the run passed and named on the
# last line when it failed. Mode 1777 as /tmp: a test that acts as another user makes its
# folders in it.
RUN_TEMP_FOLDER = "hvd_ctsm-tests."
RUN_TEMP_KEY = pytest.StashKey[tuple[str, str | None, str | None]]()  # folder, TMPDIR, tempdir
RUN_STATUS_KEY = pytest.StashKey[int]()
# What a user may want to look into; other runs ran nothing (a usage error) or all passed.
KEEPS_TEMP_FILES = {pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.INTERRUPTED,
                    pytest.ExitCode.INTERNAL_ERROR}


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # an xdist worker: its controller made the folder
        return
    folder = tempfile.mkdtemp(prefix=RUN_TEMP_FOLDER)
    os.chmod(folder, 0o1777)
    config.stash[RUN_TEMP_KEY] = (folder, os.environ.get("TMPDIR"), tempfile.tempdir)
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = folder  # this process had already asked (pytest's capture files)


def pytest_sessionfinish(session, exitstatus):
    session.config.stash[RUN_STATUS_KEY] = exitstatus


def pytest_unconfigure(config):
    if RUN_TEMP_KEY not in config.stash:
        return
    folder, tmpdir, tempdir = config.stash[RUN_TEMP_KEY]
    # As they were: a process that runs pytest.main() again (an IDE's) makes its next folder
    # where it made this one, not in this one, gone.
    if tmpdir is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = tmpdir
    tempfile.tempdir = tempdir
    if config.stash.get(RUN_STATUS_KEY, pytest.ExitCode.OK) in KEEPS_TEMP_FILES:
        print(f"the tests' temporary files are kept in {folder}", file=sys.stderr)
    else:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def ml100k() -> Path:
    path = ml100k_dir()
    if not (path / "u.data").exists():
        pytest.fail(f"MovieLens 100K not found at {path}; set ML100K_DIR to its folder")
    return path


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One real local Spark session (local[2]) shared by every test that needs it. Its
    catalog's warehouse is a temporary folder: Spark makes the default database's folder
    there the first time a test uses the catalog, by default in the working directory (the
    checkout)."""
    from hvd_ctsm.spark_session import get_spark

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = get_spark(master="local[2]", app_name="hvd_ctsm-tests",
                        spark_sql_warehouse_dir=warehouse.as_uri())
    yield session
    session.stop()


def _flock_as_on_a_mount(monkeypatch, refused) -> None:
    """flock raising OSError(refused(fd)) where that is not None (no such mount can be made
    here), with no folder said unguarded yet."""
    import fcntl
    import os

    from hvd_ctsm.files import holds

    real = fcntl.flock  # the module's own: holds.fcntl is fcntl, patched below

    def flock(fd, operation):
        error = refused(fd)
        if error is not None:
            raise OSError(error, os.strerror(error))
        real(fd, operation)

    monkeypatch.setattr(holds.fcntl, "flock", flock)
    monkeypatch.delenv(holds.SAID_UNGUARDED, raising=False)


@pytest.fixture
def folders_not_lockable(monkeypatch):
    """flock answering as on an NFS mount: its client takes an exclusive flock only on a file
    open for writing (flock(2)), so a folder, open to read, gets EBADF; a stand-in."""
    import errno
    import os
    import stat

    _flock_as_on_a_mount(monkeypatch,
                         lambda fd: errno.EBADF if stat.S_ISDIR(os.fstat(fd).st_mode) else None)


@pytest.fixture
def nothing_lockable(monkeypatch):
    """flock answering as on an NFS mount without its lock manager: ENOLCK for every file and
    folder; a stand-in."""
    import errno

    _flock_as_on_a_mount(monkeypatch, lambda fd: errno.ENOLCK)


TINY_SOURCE = "synthetic:clients=160,items=60,events=6000,seed=11"


@pytest.fixture(scope="session")
def tiny_features(spark, tmp_path_factory) -> Path:
    """A small real Petastorm dataset (synthetic events) written by the real feature job."""
    from spark_jobs.build_features import build_features
    from spark_jobs.config import FeatureConfig

    out = tmp_path_factory.mktemp("features") / "tiny"
    build_features(spark, FeatureConfig(source=TINY_SOURCE, out=str(out), max_len=40,
                                        row_groups=8))
    return out
