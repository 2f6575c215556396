"""Whole-job restart after a real SIGKILL, and checkpoints damaged for real.

The trainer runs as a real process (np=1, and np=2 under horovodrun); an injected per-step delay
(`debug.step_delay_s`, test-only) slows it so the kill lands mid-epoch, right after a
mid-epoch checkpoint appeared. `--resume` must then finish with the model an uninterrupted run
ends with, bit for bit: the data position, optimizer, schedule and every rank's RNG are restored.
"""

import shutil
import sys
import time

import pytest

from hvd_ctsm.model.checkpoint import CheckpointManager, load_state, save_state
from tests.helpers import faultlib as fl

pytestmark = [pytest.mark.horovod, pytest.mark.spark, pytest.mark.slow, pytest.mark.faults]
EVERY = 4  # checkpoint_every_steps: a kill loses at most this many steps
RUN = ["--epochs", "2", f"checkpoint_every_steps={EVERY}", "keep_checkpoints=3"]
SLOW = ['debug.step_delay_s={"*": 0.15}']  # only to give the kill time to land mid-epoch


def kill_mid_epoch(data, out, np_, tmp_path):
    """Start the trainer, SIGKILL the whole job after a checkpoint inside epoch 2; the step."""
    proc = fl.start(fl.trainer_cmd(data, out, *RUN, *SLOW, np_=np_),
                    tmp_path / f"killed-{np_}.log")
    # The first epoch has 14 steps at np=1 (7 at np=2): wait for one inside the second epoch.
    per_epoch = 14 // np_
    step = fl.wait_for(lambda: fl.mid_epoch_checkpoint(out, per_epoch + 1), proc,
                       what="a mid-epoch checkpoint")
    fl.sigkill_tree(proc)
    assert proc.returncode == -9, "the job was killed by SIGKILL, not ended by itself"
    assert not (out / "model.pt").exists()
    latest = fl.checkpoint_steps(out)[-1]
    assert latest >= step and latest % EVERY == 0 and latest % per_epoch != 0  # mid-epoch
    return latest


def resume(data, out, np_, tmp_path):
    """Run with --resume; (its output, seconds from the restart until training went on)."""
    log = tmp_path / f"resume-{out.name}.log"
    t0 = time.monotonic()
    proc = fl.start(fl.trainer_cmd(data, out, *RUN, "--resume", np_=np_), log)
    fl.wait_for(lambda: "resumed from step" in log.read_text(), proc, what="the resume")
    seconds = time.monotonic() - t0
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    return log.read_text(), seconds


def test_sigkill_mid_epoch_then_resume_is_bitwise_equal_np1(tiny_features, tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    fl.run(fl.trainer_cmd(tiny_features, whole, *RUN))
    latest = kill_mid_epoch(tiny_features, killed, 1, tmp_path)
    damaged = tmp_path / "damaged"
    shutil.copytree(killed, damaged)
    # Steps trained after the last checkpoint are trained again: at most EVERY of them.
    last_logged = max(r["step"] for r in fl.read_jsonl(killed / "train_log.jsonl"))
    assert 0 <= last_logged - latest <= EVERY

    log, seconds = resume(tiny_features, killed, 1, tmp_path)
    assert f"resumed from step {latest} " in log
    assert fl.same_model(whole / "model.pt", killed / "model.pt")
    assert fl.summary(killed)["steps"] == fl.summary(whole)["steps"]
    fl.record("restart_np1", resumed_from=latest, restart_to_training_seconds=round(seconds, 1),
              steps_redone_at_least=last_logged - latest, at_most=EVERY)

    # The same killed run, now with its latest checkpoint truncated, the one before corrupted
    # (same size, bytes flipped) and a newer file that would run code when unpickled.
    steps = fl.checkpoint_steps(damaged)
    ckpt = damaged / "checkpoints"
    newest, second, third = (ckpt / f"step-{s:09d}.pt" for s in steps[::-1][:3])
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    data = bytearray(second.read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = bytes(64)
    second.write_bytes(bytes(data))
    marker = tmp_path / "code-ran"
    save_state(ckpt / "step-000000999.pt", {"model": RunsCode(marker)})
    log, _ = resume(tiny_features, damaged, 1, tmp_path)
    assert "step-000000999.pt: cannot be loaded" in log
    assert "kept damaged checkpoint step-000000999.pt as step-000000999.pt.damaged" in log
    assert "Weights only load failed" in log
    assert not marker.exists(), "loading a checkpoint ran code"
    assert f"skipping damaged checkpoint {newest}" in log and "truncated or corrupted" in log
    assert f"skipping damaged checkpoint {second}" in log
    assert f"resumed from step {steps[-3]} " in log
    assert fl.same_model(whole / "model.pt", damaged / "model.pt")
    fl.record("damaged_checkpoints_np1", fell_back_to=steps[-3], skipped=[999, *steps[::-1][:2]])


class RunsCode:
    """Unpickling this runs a shell command: what a hostile checkpoint could do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_sigkill_mid_epoch_then_resume_np2(tiny_features, tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    fl.run(fl.trainer_cmd(tiny_features, whole, *RUN, np_=2))
    latest = kill_mid_epoch(tiny_features, killed, 2, tmp_path)
    log, seconds = resume(tiny_features, killed, 2, tmp_path)
    assert f"resumed from step {latest} " in log
    checksums = fl.summary(killed)["parameter_checksums"]
    assert len(checksums) == 2 and checksums[0] == checksums[1]
    # Two ranks over Gloo sum in a fixed order and each rank's RNG is restored: bitwise too.
    difference = fl.max_abs_difference(whole / "model.pt", killed / "model.pt")
    assert difference == 0.0
    fl.record("restart_np2", resumed_from=latest, restart_to_training_seconds=round(seconds, 1),
              max_abs_difference=difference)


WRITER = """
import sys, torch
from hvd_ctsm.model.checkpoint import CheckpointManager
manager = CheckpointManager(sys.argv[1], keep=2)
state = {"w": torch.randn(6_000_000)}  # ~24 MB: a write takes long enough to be hit
for step in range(1, 10_000):
    state["step"] = step
    manager.save(state, step)
"""


def test_a_kill_during_a_checkpoint_write_leaves_no_half_file(tmp_path):
    folder = tmp_path / "checkpoints"
    interrupted = 0
    for _ in range(3):
        proc = fl.start([sys.executable, "-c", WRITER, str(folder)], tmp_path / "writer.log")
        # Kill while a temporary file exists (in the middle of a write) after a first
        # checkpoint is complete.
        fl.wait_for(lambda: fl.checkpoint_steps(tmp_path) and list(folder.glob(".step-*.tmp")),
                    proc, what="a write in progress")
        fl.sigkill_tree(proc)
        interrupted += bool(list(folder.glob(".step-*.tmp")))
        manager = CheckpointManager(folder, keep=2)
        for step in manager.steps():  # every visible checkpoint is whole and loads
            assert load_state(manager.path_for(step))["w"].numel() == 6_000_000
        assert manager.load_latest()["step"] == manager.steps()[-1]
        manager.remove_partial_writes()
        assert not list(folder.glob(".*.tmp"))
    assert interrupted >= 1, "no kill landed mid-write: the test did not test anything"
    fl.record("kill_during_checkpoint_write", kills=3, kills_mid_write=interrupted)
