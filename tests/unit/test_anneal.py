"""Annealing on the plateau (anneal_after_evals): when it fires, how early stopping counts after
it, the lower lr, and a real two-rank run that anneals, stays in sync and resumes annealed.
This file holds the unit-tier part; the rest is in tests/integration/test_anneal.py."""

from types import SimpleNamespace

import pytest
import torch

from hvd_ctsm.config import load_config
from hvd_ctsm.train.trainer import Trainer


def rules(*overrides):
    """Trainer's stopping rules read only its config: call them on a stand-in holding one."""
    cfg = load_config(None, ["eval_every_epochs=2", *overrides])
    return SimpleNamespace(cfg=cfg, rows_per_epoch=1000)  # ML-100K's size: 5 validations


def test_the_anneal_fires_once_after_its_stalled_validations():
    t = rules("anneal_after_evals=3", "early_stop_evals=2")
    best = {"ndcg@10": 0.1, "epoch": 10}
    assert not Trainer.anneal_due(t, best, 14)  # 2 validations without a better one
    assert Trainer.anneal_due(t, best, 16)
    assert not Trainer.anneal_due(t, best | {"annealed_at": 16}, 20)  # once only
    assert not Trainer.anneal_due(t, best, t.cfg.epochs)  # no epoch left to train at the end
    assert not Trainer.anneal_due(rules("anneal_after_evals=0"), best, 60)
    assert not Trainer.anneal_due(t, {"ndcg@10": float("-inf")}, 16)  # never validated


def test_early_stopping_waits_for_the_anneal_and_then_counts_from_it():
    t = rules("anneal_after_evals=3", "early_stop_evals=2")
    best = {"ndcg@10": 0.1, "epoch": 10}
    assert not Trainer.no_longer_improving(t, best, 40)  # not annealed yet: anneal first
    annealed = best | {"annealed_at": 16}
    assert not Trainer.no_longer_improving(t, annealed, 18)
    assert Trainer.no_longer_improving(t, annealed, 20)
    better_after = annealed | {"epoch": 18}  # a better validation after the anneal
    assert not Trainer.no_longer_improving(t, better_after, 20)
    assert Trainer.no_longer_improving(t, better_after, 22)
    without = rules("early_stop_evals=2")  # the option off: today's rule
    assert Trainer.no_longer_improving(without, best, 14)


def test_lower_lr_scales_the_lr_now_and_every_later_step():
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    t = SimpleNamespace(cfg=load_config(None, ["anneal_lr_factor=0.1"]), scheduler=scheduler,
                        optimizer=optimizer)
    Trainer.lower_lr(t)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 / 4)  # the next step's lr
    optimizer.step()
    scheduler.step()
    assert scheduler.get_last_lr()[0] == pytest.approx(0.1 / 5)
    resumed = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([weight], lr=1.0),
                                                lambda step: 1.0 / (1 + step))
    resumed.load_state_dict(scheduler.state_dict())  # what --resume does: the factor comes too
    resumed.optimizer.step()
    resumed.step()
    assert resumed.get_last_lr()[0] == pytest.approx(0.1 / 6)


@pytest.mark.parametrize("overrides, message", [
    (["anneal_lr_factor=0"], "anneal_lr_factor must be in (0, 1]"),
    (["anneal_after_evals=-1"], "anneal_after_evals must be >= 0"),
    (["anneal_after_evals=2", "optim.ema_decay=0.9"], "anneal_after_evals needs optim.ema_decay=0"),
])
def test_bad_anneal_settings_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("]", r"\]")):
        load_config(None, overrides)
