"""Checkpoints: checksummed atomic files, fallback past damage, warm start on a new vocabulary."""

from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from hvd_ctsm.config import ModelConfig, TrainConfig
from hvd_ctsm.model import checkpoint
from hvd_ctsm.model.checkpoint import CheckpointManager, load_state, save_state
from hvd_ctsm.model.ctsm import CTSM, ModelSizes
from hvd_ctsm.train.run_folder import check_warm_start_matches
from hvd_ctsm.train.support import lr_scale, lr_schedule, warm_start


def test_keeps_the_last_k_and_the_best(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    for step in (10, 20, 30):
        manager.save({"step": step, "w": torch.full((3,), float(step))}, step, is_best=step == 20)
    assert manager.steps() == [20, 30]
    assert load_state(tmp_path / "best.pt")["step"] == 20
    assert manager.load_latest()["step"] == 30
    assert not list(tmp_path.glob("*.tmp"))


def test_a_damaged_latest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
    manager = CheckpointManager(tmp_path, keep=3)
    manager.save({"step": 1}, 1)
    path = manager.save({"step": 2}, 2)
    path.write_bytes(path.read_bytes()[:20])  # truncated
    assert manager.load_latest()["step"] == 1
    assert "skipping damaged checkpoint" in caplog.text


def test_a_folder_of_damaged_checkpoints_is_refused_not_started_over(tmp_path, caplog):
    """Every step checkpoint damaged: best.pt, a whole copy of one, is resumed from; with it
    damaged too the resume is refused (it said 'no checkpoint', trained from scratch, exit 0).
    The damaged files stay where they are."""
    manager = CheckpointManager(tmp_path, keep=3)
    for step in (1, 2):
        manager.save({"step": step}, step, is_best=step == 1)
    for step in (1, 2):
        manager.path_for(step).write_bytes(b"damaged")
    (tmp_path / "best.pt").write_bytes(b"damaged")
    with pytest.raises(checkpoint.CheckpointError,
                       match="no checkpoint in .* loads .*step-000000002.pt, .*best.pt"):
        manager.load_latest()
    assert "step-000000002.pt: checksum mismatch" in caplog.text
    assert [p.name for p in sorted(tmp_path.glob("*.pt"))] == [
        "best.pt", "step-000000001.pt", "step-000000002.pt"]
    assert CheckpointManager(tmp_path / "none", keep=3).load_latest() is None


def test_damaged_checkpoints_are_set_aside_not_counted_among_those_kept(tmp_path, caplog):
    """Resumed from an older checkpoint, the damaged newer ones counted among the `keep` newest
    by their step numbers: with keep=2 the step resumed from was pruned at the next save, with
    keep=1 each new checkpoint as it was written, and a save at a damaged one's step replaced
    it. They are kept, renamed, and no longer counted."""
    manager = CheckpointManager(tmp_path, keep=1)
    manager.save({"step": 10}, 10, is_best=True)
    for step in (20, 30):  # written by the run, then damaged (the manager's keep is 1)
        save_state(manager.path_for(step), {"step": step})
        manager.path_for(step).write_bytes(b"damaged")
    assert manager.load_latest()["step"] == 10
    assert "kept damaged checkpoint step-000000030.pt as step-000000030.pt.damaged" in caplog.text
    manager.save({"step": 11}, 11)  # the resumed run's next checkpoint
    assert manager.steps() == [11] and manager.load_latest()["step"] == 11
    manager.save({"step": 20}, 20)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "best.pt", "best.pt.sha256", "step-000000020.pt", "step-000000020.pt.damaged",
        "step-000000020.pt.damaged.sha256", "step-000000020.pt.sha256",
        "step-000000030.pt.damaged", "step-000000030.pt.damaged.sha256"]
    assert (tmp_path / "step-000000030.pt.damaged").read_bytes() == b"damaged"
    # Damaged again at that step and resumed from best.pt: the earlier copy is not replaced
    manager.path_for(20).write_bytes(b"damaged again")
    assert manager.load_latest()["step"] == 10 and manager.steps() == []
    assert (tmp_path / "step-000000020.pt.damaged").read_bytes() == b"damaged"
    assert (tmp_path / "step-000000020.pt.damaged-1").read_bytes() == b"damaged again"



def test_a_checkpoint_that_cannot_be_read_now_is_skipped_but_not_set_aside(tmp_path, caplog):
    """An I/O error may pass (a network or FUSE file system): such a file was renamed
    NAME.damaged for good, and every later resume stayed on the older checkpoint."""
    manager = CheckpointManager(tmp_path, keep=3)
    manager.save({"step": 10}, 10)
    manager.path_for(20).mkdir()  # reading it fails with an OSError, as an EIO would
    assert manager.load_latest()["step"] == 10
    assert f"skipping unreadable checkpoint {manager.path_for(20)}" in caplog.text
    assert manager.steps() == [10, 20] and not list(tmp_path.glob("*.damaged"))


def dies_at(call: int, real):
    """`real`, except that its call-th call is a kill: it raises and nothing after it runs."""
    calls = []

    def wrapper(*args):
        calls.append(args)
        if len(calls) == call:
            raise KeyboardInterrupt("killed")
        return real(*args)
    return wrapper


# A file and its checksum go into place one rename after the other. Dying at either while a
# checkpoint is rewritten (a restarted run's step, best.pt) must leave the old or the new one,
# whole and loadable, never a checksum of another file beside it.
@pytest.mark.parametrize("crash_at", [1, 2])
def test_a_kill_while_a_step_is_rewritten_leaves_one_that_loads(tmp_path, monkeypatch, crash_at):
    manager = CheckpointManager(tmp_path, keep=2)
    manager.save({"w": torch.zeros(3)}, 1)
    monkeypatch.setattr(checkpoint, "atomic_write_bytes",
                        dies_at(crash_at, checkpoint.atomic_write_bytes))
    with pytest.raises(KeyboardInterrupt):
        manager.save({"w": torch.ones(3)}, 1)
    assert load_state(manager.path_for(1))["w"].tolist() in ([0.0] * 3, [1.0] * 3)


@pytest.mark.parametrize("crash_at", [1, 2])
def test_a_kill_while_best_is_replaced_leaves_one_that_loads(tmp_path, monkeypatch, crash_at):
    manager = CheckpointManager(tmp_path, keep=2)
    manager.save({"w": torch.zeros(3)}, 1, is_best=True)
    manager.save({"w": torch.ones(3)}, 2)
    monkeypatch.setattr(checkpoint.os, "replace", dies_at(crash_at, checkpoint.os.replace))
    with pytest.raises(KeyboardInterrupt):
        manager._copy_atomic(manager.path_for(2), tmp_path / "best.pt")
    assert load_state(tmp_path / "best.pt")["w"].tolist() in ([0.0] * 3, [1.0] * 3)


def test_warm_start_keeps_old_rows_of_a_grown_vocabulary(tmp_path):
    torch.manual_seed(0)
    old = CTSM(ModelSizes(num_items=20, num_event_types=5, attr_sizes=[3], max_len=8),
               ModelConfig(dim=8, layers=1, heads=2))
    save_state(tmp_path / "model.pt", {"model": old.state_dict()})
    new = CTSM(ModelSizes(num_items=26, num_event_types=5, attr_sizes=[3], max_len=8),
               ModelConfig(dim=8, layers=1, heads=2))
    warm_start(new, str(tmp_path / "model.pt"), root=True)
    assert torch.equal(new.encoder.item.weight[:20], old.encoder.item.weight)
    assert torch.equal(new.heads["next_item"].bias[:20], old.heads["next_item"].bias)
    assert torch.equal(new.encoder.blocks[0].qkv.weight, old.encoder.blocks[0].qkv.weight)


def test_warm_start_refuses_another_architecture_in_one_line(tmp_path):
    """The default went from 2 x 2 to 3 x 4 blocks: an old deployed model must not load into
    a new default silently (its weights read with other heads, a third layer left random)."""
    sizes = ModelSizes(num_items=20, num_event_types=5, attr_sizes=[3], max_len=8)
    old_config = ModelConfig(dim=8, layers=1, heads=2, dropout=0.1)
    old = CTSM(sizes, old_config)
    path = str(tmp_path / "model.pt")
    save_state(Path(path), {"model": old.state_dict(), "config": {"model": asdict(old_config)}})
    with pytest.raises(SystemExit) as refused:
        check_warm_start_matches(path, TrainConfig(model=ModelConfig(dim=8, layers=1, heads=4)))
    message = str(refused.value)
    assert "\n" not in message and "model.heads=2" in message and "model.heads=4" in message
    assert "model.layers" not in message  # only what differs is named
    same_network = ModelConfig(dim=8, layers=1, heads=2, dropout=0.3, loss="bce")
    check_warm_start_matches(path, TrainConfig(model=same_network))  # passes
    new = CTSM(sizes, same_network)
    warm_start(new, path, root=True)
    assert torch.equal(new.encoder.blocks[0].qkv.weight, old.encoder.blocks[0].qkv.weight)


def test_lr_rules_and_warmup():
    from hvd_ctsm.config import OptimConfig

    optim = OptimConfig(lr=1e-3, base_batch_size=64, lr_scaling="linear", warmup_steps=10,
                        decay="cosine", min_lr_ratio=0.1)
    assert lr_scale(optim, 256) == 4.0
    assert lr_scale(OptimConfig(base_batch_size=64, lr_scaling="sqrt"), 256) == 2.0
    factor = lr_schedule(optim, scale=4.0, total_steps=110)
    assert factor(0) == 0.25  # warm-up starts at the unscaled lr
    assert factor(10) == 1.0  # and reaches the scaled lr
    assert abs(factor(110) - 0.1) < 1e-9  # cosine ends at min_lr_ratio


def test_a_file_that_is_not_a_model_is_bad_input_not_a_crash(tmp_path):
    """`score --model report.json` said 'crashed: CheckpointError ...', exit 3."""
    from hvd_ctsm.errors import EXIT_BAD_INPUT, exit_code_for
    from hvd_ctsm.model.checkpoint import CheckpointError, load_state

    report = tmp_path / "r.json"
    report.write_text("{}")
    with pytest.raises(CheckpointError, match="cannot be loaded: not a model or checkpoint") as e:
        load_state(report)
    assert exit_code_for(e.value) == EXIT_BAD_INPUT and "\n" not in str(e.value)


def test_a_training_checkpoint_given_as_a_model_is_named_as_such(tmp_path):
    """backtest --model RUN/checkpoints/best.pt said "missing field 'sizes' in an input file"."""
    path = tmp_path / "best.pt"
    save_state(path, {"model": {}, "optimizer": {}, "config": {}, "position": {}})
    with pytest.raises(checkpoint.CheckpointError, match="best.pt is not a model.pt .* a training "
                                              "checkpoint .* pass the run folder, or its model"):
        checkpoint.load_model(path)
