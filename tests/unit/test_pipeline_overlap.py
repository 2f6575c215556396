"""Two pipeline runs into one --work folder (a schedule's next run started before the last one
ended): the second is refused in one line before any step; the first's hold dies with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from hvd_ctsm.files import holds, outputs
from spark_jobs.pipeline import (PipelineConfig, check_work, check_work_free, main, run_pipeline,
                                 work_held)
from tests.conftest import REPO, TINY_SOURCE

HOLDER = """
import sys, time
from pathlib import Path
from spark_jobs.pipeline import work_held
with work_held(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_second_pipeline_into_a_work_folder_in_use_is_refused_in_one_line(tmp_path, capsys):
    work, registry = tmp_path / "work", tmp_path / "registry"
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(work)], cwd=REPO, text=True,
                             stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert first.stdout.readline().strip() == "held"
        cfg = PipelineConfig(source=TINY_SOURCE, work=str(work), registry=str(registry))
        # Refused before any step: no Spark session is needed to say so.
        assert run_pipeline(None, cfg) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"hvd-ctsm pipeline: error: another pipeline is writing {work} now: wait for it to "
            "end, or pick another --work"]
        assert sorted(p.name for p in work.iterdir()) == []  # nothing written into the first's
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    with work_held(work):  # a killed run leaves no hold behind
        pass


def test_the_command_refuses_a_work_folder_in_use_before_it_starts_spark(tmp_path, capsys):
    """Before: the command started its Spark application (a local JVM with the driver heap
    sized for the source, beside the first run's training) only to be refused."""
    from pyspark import SparkContext

    work, registry = tmp_path / "work", tmp_path / "registry"
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(work)], cwd=REPO, text=True,
                             stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert first.stdout.readline().strip() == "held"
        assert main(["--source", TINY_SOURCE, "--work", str(work), "--registry",
                     str(registry)]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"hvd-ctsm pipeline: error: another pipeline is writing {work} now: wait for it to "
            "end, or pick another --work"]
        assert SparkContext._active_spark_context is None
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)


def test_on_nfs_a_second_pipeline_is_refused_by_the_file_its_work_is_held_by(
        tmp_path, capsys, folders_not_lockable):
    """On NFS a folder cannot be flocked (its client locks only files open for writing): a
    second pipeline into one --work ran beside the first (later, with a warning). A stand-in
    for that mount: flock refusing folders as it does there. Another open of the hold file
    stands for another process."""
    work, registry = tmp_path / "work", tmp_path / "registry"
    with work_held(work):
        cfg = PipelineConfig(source=TINY_SOURCE, work=str(work), registry=str(registry))
        assert run_pipeline(None, cfg) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"hvd-ctsm pipeline: error: another pipeline is writing {work} now: wait for it to "
        "end, or pick another --work"]
    assert [p.name for p in work.iterdir()] == [outputs.HOLD]
    check_work(work)  # a work folder holding only its hold file is an empty one
    check_work_free(work)


def test_on_nfs_an_earlier_unmarked_work_folder_is_held_on_its_first_run(tmp_path, capsys,
                                                                        folders_not_lockable):
    """A work folder from before work folders were marked (pipeline.json and what a run writes)
    is taken (check_work); on NFS its first run held nothing and said nothing, since no hold
    file is made in a folder not ours. Now it is marked before the hold. The NFS stand-in."""
    work, registry = tmp_path / "work", tmp_path / "registry"
    work.mkdir()
    (work / "pipeline.json").write_text("{}")
    (work / "features").mkdir()
    check_work(work, registry)
    with work_held(work):
        cfg = PipelineConfig(source=TINY_SOURCE, work=str(work), registry=str(registry))
        assert run_pipeline(None, cfg) == 2  # refused by the hold file
    assert capsys.readouterr().err.splitlines() == [
        f"hvd-ctsm pipeline: error: another pipeline is writing {work} now: wait for it to "
        "end, or pick another --work"]
    assert outputs.marker(work)["kind"] == "pipeline"
    assert sorted(p.name for p in work.iterdir()) == sorted(
        [outputs.HOLD, outputs.MARKER, "features", "pipeline.json"])


def test_a_work_folder_where_nothing_can_be_locked_is_said_unguarded_once(tmp_path, capsys,
                                                                          nothing_lockable):
    """A mount without a lock manager (ENOLCK) locks neither the folder nor a file in it: the
    pipeline goes on unguarded and says so. The command's check and the run's hold say it once
    between them."""
    from hvd_ctsm.train.run_folder import hold_run_folder, release_run_folder

    work = tmp_path / "work"
    work.mkdir()
    check_work_free(work)
    with work_held(work):
        # its training (ranks started with this environment) does not say it of its run folder
        hold_run_folder(work / "pipeline" / "model", until_released=True)
        release_run_folder(work / "pipeline" / "model")
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {work} is on a file system that cannot lock its folders or files (No locks "
        "available): a second pipeline into it at the same moment would not be refused; run "
        "one pipeline in this --work at a time"]


def test_the_ranks_on_spark_are_told_what_the_pipeline_said_unguarded(monkeypatch):
    """A Spark task's rank does not inherit the driver's environment: the pipeline's training
    warned again of its run folder inside the unguarded --work (seen by hand on NFS's stand-in)."""
    from hvd_ctsm.train.spark_train import rank_environment

    monkeypatch.delenv(holds.SAID_UNGUARDED, raising=False)
    assert holds.SAID_UNGUARDED not in rank_environment(1)
    monkeypatch.setenv(holds.SAID_UNGUARDED, "/nfs/work/pipeline")
    assert rank_environment(1)[holds.SAID_UNGUARDED] == "/nfs/work/pipeline"

