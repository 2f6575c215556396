"""The trainer's loop under hvd.elastic.run (`python -m hvd_ctsm.train --elastic ...`).

The data plan and the elastic state are explained in hvd_ctsm/train/elastic.py. What one (re)start
of
the loop does: log a change of world size, rescale the lr for the new effective batch, then train
from the committed (epoch, rows) position to the end, committing every `commit_every_steps` steps.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch

from hvd_ctsm import distributed as dist
from hvd_ctsm.train import faults
from hvd_ctsm.train.elastic import (GlobalOrder, RowGroupCache, SampleClock, announce_size,
                                    epoch_batches, plan_or_fail, row_groups, set_lr_scale)
from hvd_ctsm.train.support import (check_elastic_config, lr_scale, lr_schedule, make_optimizer,
                                    progress_bar, warm_start, with_item_decay_resolved)
from hvd_ctsm.train.trainer import Trainer, start_rank


def build(cfg, init_from) -> tuple[Trainer, list, SampleClock, int]:
    dataset, device, model = start_rank(cfg)
    if init_from:
        # rank 0 loads; the first sync broadcasts its weights
        warm_start(model, init_from, dist.is_root())
    groups = row_groups(dataset.split("train"))
    batch = cfg.data.batch_size
    plan_or_fail(groups, batch, dist.size())
    clock = SampleClock(batch * dist.size())
    steps_per_epoch = sum(g.rows for g in groups) // clock.unit
    total = steps_per_epoch * cfg.epochs
    # after the split's files were checked: a damaged dataset's error stays the only line
    cfg = with_item_decay_resolved(cfg, dataset.meta, announce=dist.is_root())
    # Elastic Horovod only (train.check_launch); one micro-batch a step (check_elastic_config).
    net, optimizer = dist.current().wrap(model, make_optimizer(model, cfg.optim, cfg.optim.lr),
                                         cfg.dist)
    factor = lr_schedule(cfg.optim, lr_scale(cfg.optim, clock.unit), total)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: factor(clock.step()))
    trainer = Trainer(cfg, dataset, model, device, optimizer, scheduler, net=net,
                      effective_batch=clock.unit, total_steps=total)
    return trainer, groups, clock, steps_per_epoch


def run(cfg, init_from: str | None = None) -> dict:
    check_elastic_config(cfg)
    trainer, groups, clock, steps_per_epoch = build(cfg, init_from)
    out, batch = Path(cfg.out), cfg.data.batch_size
    cache = RowGroupCache(trainer.dataset.split("train"))
    started = time.time()
    state = dist.elastic_state(trainer.model, trainer.optimizer, epoch=0, rows=0, step=0,
                               samples=0, size=dist.size(), best={"ndcg@10": float("-inf")},
                               history=[], best_weights=None, average=None)

    def commit(state) -> None:
        trainer.settle_rows()  # the committed weights are whole (optim.lazy_rows)
        if dist.is_root():
            faults.append_event(out, {"event": "commit", "epoch": state.epoch,
                                      "rows": state.rows, "step": state.step,
                                      "size": dist.size()})
        if trainer.average:  # a copy: the average changes in place, the commit must not
            state.average = copy.deepcopy(trainer.average.state_dict())
        state.commit()  # may raise HostsUpdatedInterrupt: the loop restarts from here

    @dist.elastic_run
    def loop(state):
        announce_size(state, out, started)
        trainer.effective_batch = batch * dist.size()
        set_lr_scale(cfg.optim, trainer.scheduler, trainer.effective_batch)
        clock.samples = state.samples
        if trainer.average:  # the committed average, else one of the weights we start from
            trainer.average.restart(trainer.model, state.average)
        # resume=True: a rank 0 that replaces a failed one adds to the run it started.
        trainer.open_logs(resume=True)
        while state.epoch < cfg.epochs and not trainer.no_longer_improving(state.best,
                                                                           state.epoch):
            order = GlobalOrder(groups, cfg.seed, state.epoch)
            for rows, batch_ in epoch_batches(order, cache, state.rows, batch,
                                              trainer.model.sizes.max_len):
                losses = trainer.step(faults.delayed(iter([batch_]), dist.rank(),
                                                     cfg.debug.step_delay_s))
                state.rows, state.step = rows, state.step + 1
                state.samples = clock.samples = state.samples + batch * dist.size()
                if state.step % cfg.log_every_steps == 0:
                    trainer.log(state.step, losses, progress_bar(False, 0, 0))
                if state.step % cfg.commit_every_steps == 0:
                    commit(state)
            end_epoch(state, trainer)
            commit(state)

    # A failure that gets out of the elastic loop (a damaged file, Ctrl-C) ends rank 0's logs at
    # once: before, the MLflow run stayed RUNNING until the process ended (a notebook's kernel).
    with faults.peer_loss_reported(cfg, trainer.model), trainer.logs_ended_on_failure():
        loop(state)
        summary = {"steps": state.step, "elastic": True, "samples": state.samples,
                   "steps_per_epoch_at_start": steps_per_epoch, "best": state.best,
                   "validation": state.history[-1] if state.history else None}
        return trainer.finish(summary, lambda: use_best_weights(trainer.model, state))


def use_best_weights(model, state) -> int | None:
    """model.pt is the best validated model, not the last: load the committed copy."""
    if state.best_weights is None:
        return None
    model.load_state_dict(state.best_weights)
    return state.best["epoch"]


def end_epoch(state, trainer: Trainer) -> None:
    """Validate (a collective over the current ranks), then move the position to the next epoch.
    New objects, not in-place changes: the committed state keeps references to the old ones."""
    cfg = trainer.cfg
    epoch = state.epoch + 1
    if epoch % cfg.eval_every_epochs == 0 or epoch == cfg.epochs:
        record = {"epoch": epoch, "step": state.step, "size": dist.size()}
        metrics = trainer.validate(record)
        state.history = [*state.history, record | metrics]
        if metrics["full"]["ndcg@10"] > state.best["ndcg@10"]:
            state.best = {"ndcg@10": metrics["full"]["ndcg@10"], "epoch": epoch}
            # A copy on every rank (the models are equal): a new rank gets it with the state.
            with trainer.averaged():
                state.best_weights = {k: v.detach().cpu().clone()
                                      for k, v in trainer.model.state_dict().items()}
    state.epoch, state.rows = epoch, 0
