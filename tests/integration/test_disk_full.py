"""The steps on a disk that fills up while they write: a real small filesystem (tmpfs), filled
to leave a chosen number of bytes, under the real commands. Mounting one needs root (CI runs
as root); elsewhere these tests skip, and tests/unit/test_disk_full.py still runs.

Each step ends in one line naming the file and the way on (exit 3), leaves no file cut short
where a later run reads it and keeps the output it had; once there is room, the same command
(training: with --resume) goes on."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_ctsm.files import outputs
from tests.conftest import REPO

PAGE = os.sysconf("SC_PAGE_SIZE")  # tmpfs counts what it holds in pages
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")  # the trainer's logging


class SmallDisk:
    """A tmpfs of `size_mb` at `folder`; `leave(n)` fills it to leave n bytes free."""

    def __init__(self, folder: Path, size_mb: int):
        self.folder, self.filler = folder, folder / ".filler"
        folder.mkdir()
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs",
                                  str(folder)], capture_output=True, text=True)
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")

    def leave(self, free: int) -> None:
        self.filler.unlink(missing_ok=True)
        stat = os.statvfs(self.folder)
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT)
        try:
            os.posix_fallocate(fd, 0, stat.f_bavail * stat.f_frsize - free)
        finally:
            os.close(fd)

    def make_room(self) -> None:
        self.filler.unlink()

    def unmount(self) -> None:
        if subprocess.run(["umount", str(self.folder)]).returncode != 0:
            subprocess.run(["umount", "-l", str(self.folder)])  # a child still in it


@pytest.fixture
def small_disk(tmp_path):
    def make(size_mb: int) -> SmallDisk:
        made.append(SmallDisk(tmp_path / f"disk{len(made)}", size_mb))
        return made[-1]

    made: list[SmallDisk] = []
    yield make
    for disk in made:
        disk.unmount()


def hvd_ctsm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvd_ctsm", *args], capture_output=True,
                          text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})


def said(stderr: str) -> list[str]:
    """stderr less the trainer's log lines: what the command says to the user."""
    return [line for line in stderr.splitlines() if not LOG_LINE.match(line)]


SMALL_MODEL = ["--epochs", "2", "data.batch_size=16", "model.dim=32", "model.layers=1",
               "checkpoint_every_steps=4", "progress=false", "tracking.enabled=false"]


@pytest.mark.parametrize("free", [0, 2 * PAGE, 100 * PAGE],
                         ids=["the-marker", "tensorboard", "a-later-checkpoint"])
def test_training_on_a_full_disk_is_one_line_and_resume_goes_on(tiny_features, small_disk,
                                                                 free):
    """Before: "crashed: OSError: [Errno 28] No space left on device", naming no file; a marker
    cut short (0 bytes) made every later run into the folder refused as not ours; TensorBoard's
    writer thread printed "Exception in thread Thread-1:" into the line."""
    disk = small_disk(16)
    out = disk.folder / "run"
    disk.leave(free)
    failed = hvd_ctsm("train", "--data", str(tiny_features), "--out", str(out), *SMALL_MODEL)
    assert failed.returncode == 3, failed.stderr[-3000:]
    assert len(said(failed.stderr)) == 1, failed.stderr[-3000:]
    line = said(failed.stderr)[0]
    assert line.startswith(f"hvd-ctsm train: error: no space left on device writing {out}")
    if outputs.is_empty(out):  # nothing written: --resume would be refused there
        assert line.endswith("then run the command again")
        flags = []
    else:
        assert outputs.marker(out)["kind"] == "run"
        assert line.endswith(f"then the same command with --resume goes on from the last "
                             f"checkpoint in {out}")
        flags = ["--resume"]
    disk.make_room()
    resumed = hvd_ctsm("train", "--data", str(tiny_features), "--out", str(out), *flags,
                       *SMALL_MODEL)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (out / "model.pt").is_file() and not list(out.rglob(".*.tmp"))


@pytest.mark.slow  # it mounts a filesystem: the integration tier
def test_a_best_checkpoint_that_does_not_fit_leaves_no_partial_copy(small_disk):
    """Before: its temporary copy (up to a checkpoint's size) stayed on the full disk until
    the next save, which a resume with nothing left to train never makes, and the error named
    that temporary file."""
    import torch

    from hvd_ctsm.model.checkpoint import CheckpointManager, load_state

    disk = small_disk(1)
    checkpoints = CheckpointManager(disk.folder / "checkpoints", keep=2)
    checkpoints.folder.mkdir()
    state = {"model": torch.arange(20000, dtype=torch.float32)}  # 20 pages and a bit
    disk.leave((21 + 1 + 1) * PAGE)  # the step and its checksum fit; best.pt's copy does not
    with pytest.raises(OSError) as full:
        checkpoints.save(state, 4, is_best=True)
    assert full.value.filename == str(checkpoints.folder / "best.pt")
    assert sorted(p.name for p in checkpoints.folder.iterdir()) == [
        "step-000000004.pt", "step-000000004.pt.sha256"]
    assert torch.equal(load_state(checkpoints.path_for(4))["model"], state["model"])


def fake_features(folder: Path) -> Path:
    """What a deploy reads of the features its report names (deploy trains nothing)."""
    folder.mkdir()
    (folder / "metadata.json").write_text("{}")
    (folder / "vocab.json").write_text('{"items": []}')
    return folder


def fake_run(folder: Path, weights: bytes, data: Path) -> tuple[Path, Path]:
    """A run deploy takes (it checks the files and the checksum, loads no model) and its
    report whose gate passed."""
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(weights)
    Path(f"{folder / 'model.pt'}.sha256").write_text(hashlib.sha256(weights).hexdigest())
    (folder / "config.yaml").write_text("epochs: 1\n")
    report = folder / "backtest.json"
    report.write_text(json.dumps({"data": str(data), "model": {},
                                  "gate": {"passed": True, "checks": []},
                                  "model_sha256": hashlib.sha256(weights).hexdigest()}))
    return folder, report


@pytest.mark.slow  # subprocesses
def test_a_deploy_whose_current_does_not_fit_leaves_the_registry_as_it_was(small_disk,
                                                                            tmp_path):
    """Before: the new version stayed, `current` still named the old one, exit 3 without a
    file named; the next deploy then made a copy of it as one more version."""
    data = fake_features(tmp_path / "features")
    disk = small_disk(1)
    registry = disk.folder / "registry"
    first = fake_run(tmp_path / "first", b"weights 1", data)
    assert hvd_ctsm("deploy", "--model", str(first[0]), "--report", str(first[1]),
                    "--registry", str(registry)).returncode == 0
    second = fake_run(tmp_path / "second", b"weights 2", data)
    disk.leave(6 * PAGE)  # the version's 6 small files fit; `current`, written after, does not
    failed = hvd_ctsm("deploy", "--model", str(second[0]), "--report", str(second[1]),
                      "--registry", str(registry))
    assert failed.returncode == 3 and failed.stderr.count("\n") == 1, failed.stderr
    assert failed.stderr.startswith(f"hvd-ctsm deploy: error: no space left on device writing "
                                    f"{registry / 'current'}:")
    assert sorted(p.name for p in registry.iterdir()) == sorted(
        [".deploy.lock", outputs.MARKER, "current", "v0001"])
    assert (registry / "current").read_text() == "v0001\n"
    disk.make_room()
    again = hvd_ctsm("deploy", "--model", str(second[0]), "--report", str(second[1]),
                     "--registry", str(registry))
    assert again.returncode == 0, again.stderr
    assert (registry / "current").read_text() == "v0002\n"


@pytest.mark.slow  # subprocesses
def test_finishing_a_killed_deploy_on_a_full_disk_keeps_the_version_it_left(small_disk,
                                                                            tmp_path):
    """A deploy killed after publishing its version but before moving `current` leaves the
    version whole and unnamed; the next deploy of that model points `current` at it. When that
    `current` does not fit, the version stays: that deploy did not make it (before: removed)."""
    data = fake_features(tmp_path / "features")
    disk = small_disk(1)
    registry = disk.folder / "registry"
    for name, weights in (("first", b"weights 1"), ("second", b"weights 2")):
        model, report = fake_run(tmp_path / name, weights, data)
        assert hvd_ctsm("deploy", "--model", str(model), "--report", str(report),
                        "--registry", str(registry)).returncode == 0
    (registry / "current").write_text("v0001\n")  # as a deploy of v0002 killed before it left
    left = {p.name: p.read_bytes() for p in (registry / "v0002").iterdir()}
    disk.leave(0)
    failed = hvd_ctsm("deploy", "--model", str(model), "--report", str(report),
                      "--registry", str(registry))
    assert failed.returncode == 3 and failed.stderr.count("\n") == 1, failed.stderr
    assert (registry / "current").read_text() == "v0001\n"
    assert {p.name: p.read_bytes() for p in (registry / "v0002").iterdir()} == left
    disk.make_room()
    again = hvd_ctsm("deploy", "--model", str(model), "--report", str(report),
                     "--registry", str(registry))
    assert again.returncode == 0, again.stderr
    assert (registry / "current").read_text() == "v0002\n"
    assert sorted(p.name for p in registry.glob("v*")) == ["v0001", "v0002"]


@pytest.mark.spark
@pytest.mark.both_stacks  # Spark's words for it differ between Spark 3.5 and 4
def test_a_feature_job_overwriting_onto_a_full_disk_keeps_the_dataset(tiny_features,
                                                                      small_disk):
    """Before: Java's stack trace on one line of 13,000 characters ("crashed: Py4JJavaError");
    then the one line, but after Spark's log of each failed task (411 lines of ERROR records
    and Java traces)."""
    disk = small_disk(8)
    out = disk.folder / "features"
    shutil.copytree(tiny_features, out)
    before = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    disk.leave(20 * PAGE)
    failed = hvd_ctsm("features", "--source", "synthetic:clients=160,items=60,events=6000,seed=12",
                      "--out", str(out), "--overwrite", "--max-len", "40", "--row-groups", "8")
    assert failed.returncode == 3, failed.stderr[-3000:]
    assert failed.stderr.count("\n") == 1 and failed.stderr.startswith(
        f"hvd-ctsm features: error: no space left on device writing {out}/"), failed.stderr[-3000:]
    assert {str(p.relative_to(out)): p.read_bytes()
            for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in disk.folder.iterdir()) == [".filler", "features"]


FOLLOWED = ("hvd-ctsm train: error: another rank failed first (its error is above); this one "
            "stopped with it")


@pytest.mark.slow  # two ranks under ./run.sh's launcher
@pytest.mark.parametrize("launcher", ["torchrun",
                                      pytest.param("horovodrun", marks=pytest.mark.horovod)])
def test_at_two_ranks_the_other_rank_points_at_the_full_disks_line(tiny_features, small_disk,
                                                                    launcher):
    """Before: rank 1 added `crashed: PeerLostError: another rank stopped ...` with a guess that
    a rank ran out of memory."""
    disk = small_disk(16)
    out = disk.folder / "run"
    disk.leave(100 * PAGE)  # a later checkpoint does not fit
    args = {"torchrun": ["--standalone", "--nproc-per-node", "2", "-m", "hvd_ctsm.train"],
            "horovodrun": ["-np", "2", "--gloo", sys.executable, "-m", "hvd_ctsm.train"]}
    failed = subprocess.run(
        [sys.executable, "-m", "hvd_ctsm.distributed.launchers", launcher, *args[launcher],
         "--data", str(tiny_features), "--out", str(out), *SMALL_MODEL], capture_output=True,
        text=True, timeout=600, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert failed.returncode == 3, failed.stderr[-3000:]
    ours = [re.sub(r"^\[\d\]<stderr>:", "", line) for line in failed.stderr.splitlines()
            if "hvd-ctsm train:" in line]
    assert len(ours) == 2 and ours[1 - ours.index(FOLLOWED)].startswith(
        f"hvd-ctsm train: error: no space left on device writing {out}/"), ours


@pytest.mark.spark
@pytest.mark.both_stacks  # Horovod's route on the classic stack, TorchDistributor's on the other
def test_training_on_spark_onto_a_full_disk_is_the_ranks_line_on_the_driver(
        spark, tiny_features, small_disk, capfd):
    """Before: the notebook and the pipeline said Horovod's "Process name: 1 Exit code: 1" (and
    the ranks' tracebacks, 176 lines of stderr), or TorchDistributor's Java trace (83 lines),
    none naming the full disk."""
    from hvd_ctsm.api import train_model
    from hvd_ctsm.train.spark_train import SparkTrainingError

    disk = small_disk(16)
    out = disk.folder / "run"
    disk.leave(100 * PAGE)  # a later checkpoint does not fit
    small = [*SMALL_MODEL[2:], "dist.threads_per_rank=1"]
    with pytest.raises(SparkTrainingError) as err:
        train_model(spark, tiny_features, out, epochs=2, overrides=small)
    assert str(err.value).startswith(
        f"training on Spark failed on rank 0: no space left on device writing {out}/"
    ) and str(err.value).endswith(f"then the same command with resume=True goes on from the "
                                  f"last checkpoint in {out}"), str(err.value)
    assert "Traceback" not in capfd.readouterr().err  # each rank said its one line
    disk.make_room()
    resumed = train_model(spark, tiny_features, out, epochs=2, overrides=small, resume=True)
    assert resumed["steps"] == 2 * resumed["steps_per_epoch"] and (out / "model.pt").is_file()
