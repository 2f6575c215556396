"""The trainer's loop under hvd.elastic.run (`python -m hvd_ctsm.train --elastic ...`).

The data plan and the elastic state are explained in hvd_ctsm/elastic.py. What one (re)start of
the loop does: log a change of world size, rescale the lr for the new effective batch, then train
from the committed (epoch, rows) position to the end, committing every `commit_every_steps` steps.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from hvd_ctsm import distributed as dist
from hvd_ctsm import faults, outputs, tracking
from hvd_ctsm.data import split_url
from hvd_ctsm.elastic import (GlobalOrder, RowGroupCache, SampleClock, announce_size,
                              check_elastic_config, epoch_batches, plan_or_fail, row_groups,
                              set_lr_scale)
from hvd_ctsm.train import (Run, log_training, no_longer_improving, optimizer_step,
                            parameter_checksum, save_final_model, start_rank, validate)
from hvd_ctsm.train_support import autocast_for, lr_scale, lr_schedule, progress_bar, warm_start


def build(cfg, init_from):
    meta, device, model = start_rank(cfg)
    if init_from:
        warm_start(model, init_from, dist.is_root())  # the first sync broadcasts rank 0's
    groups = row_groups(split_url(cfg.data.path, "train"))
    batch = cfg.data.batch_size
    plan_or_fail(groups, batch, dist.size())
    clock = SampleClock(batch * dist.size())
    steps_per_epoch = sum(g.rows for g in groups) // clock.unit
    total = steps_per_epoch * cfg.epochs
    # Elastic Horovod only (train.check_launch); one micro-batch a step (check_elastic_config).
    net, optimizer = dist.current().wrap(
        model, torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr,
                                 weight_decay=cfg.optim.weight_decay), cfg.dist)
    factor = lr_schedule(cfg.optim, lr_scale(cfg.optim, clock.unit), total)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: factor(clock.step()))
    run = Run(cfg, meta, model, optimizer, scheduler, None, device, clock.unit, total, net=net)
    return run, groups, clock, steps_per_epoch


def run(cfg, init_from: str | None = None) -> dict:
    check_elastic_config(cfg)
    run_, groups, clock, steps_per_epoch = build(cfg, init_from)
    out, batch = Path(cfg.out), cfg.data.batch_size
    cache = RowGroupCache(split_url(cfg.data.path, "train"))
    autocast, scaler = autocast_for(cfg.amp, run_.device)
    started = time.time()
    state = dist.elastic_state(run_.model, run_.optimizer, epoch=0, rows=0, step=0, samples=0,
                               size=dist.size(), best={"ndcg@10": float("-inf")}, history=[],
                               best_weights=None)

    def commit(state) -> None:
        if dist.is_root():
            faults.append_event(out, {"event": "commit", "epoch": state.epoch,
                                      "rows": state.rows, "step": state.step,
                                      "size": dist.size()})
        state.commit()  # may raise HostsUpdatedInterrupt: the loop restarts from here

    @dist.elastic_run
    def loop(state):
        announce_size(state, out, started)
        run_.effective_batch = batch * dist.size()
        set_lr_scale(cfg.optim, run_.scheduler, run_.effective_batch)
        clock.samples = state.samples
        if dist.is_root() and run_.writer is None:
            out.mkdir(parents=True, exist_ok=True)
            outputs.claim(out, "run")  # --overwrite may replace it later (hvd_ctsm.outputs)
            from torch.utils.tensorboard import SummaryWriter

            # resume=True: a rank 0 that replaces a failed one adds to the run it started.
            run_.writer = tracking.metrics_writer(
                SummaryWriter(str(out / "tensorboard")), cfg, run_.meta, run_.backend.name,
                dist.size(), resume=True)
        while state.epoch < cfg.epochs and not no_longer_improving(cfg, state.best, state.epoch):
            order = GlobalOrder(groups, cfg.seed, state.epoch)
            for rows, batch_ in epoch_batches(order, cache, state.rows, batch,
                                              run_.model.sizes.max_len):
                losses = optimizer_step(run_, faults.delayed(iter([batch_]), dist.rank()),
                                        autocast, scaler)
                state.rows, state.step = rows, state.step + 1
                state.samples = clock.samples = state.samples + batch * dist.size()
                if state.step % cfg.log_every_steps == 0:
                    log_training(run_, state.step, losses, progress_bar(False, 0, 0))
                if state.step % cfg.commit_every_steps == 0:
                    commit(state)
            end_epoch(state, run_, out)
            commit(state)

    loop(state)
    checksums = dist.allgather_object(parameter_checksum(run_.model))
    summary = {"steps": state.step, "ranks": dist.size(), "elastic": True,
               "samples": state.samples, "steps_per_epoch_at_start": steps_per_epoch,
               "effective_batch": run_.effective_batch, "best": state.best,
               "validation": state.history[-1] if state.history else None,
               "parameter_checksums": checksums}
    if state.best_weights is not None:  # model.pt is the best validated model, not the last
        run_.model.load_state_dict(state.best_weights)
        summary["model_epoch"] = state.best["epoch"]
    if dist.is_root():
        save_final_model(out, run_.model, cfg, run_.meta, summary)
        run_.writer.close()
    return summary


def end_epoch(state, run_: Run, out: Path) -> None:
    """Validate (a collective over the current ranks), then move the position to the next epoch.
    New objects, not in-place changes: the committed state keeps references to the old ones."""
    from hvd_ctsm.train import log_validation

    cfg = run_.cfg
    epoch = state.epoch + 1
    if epoch % cfg.eval_every_epochs == 0 or epoch == cfg.epochs:
        metrics = validate(run_.model, cfg, run_.meta, run_.device)
        record = {"epoch": epoch, "step": state.step, "size": dist.size(), **metrics}
        state.history = [*state.history, record]
        if metrics["full"]["ndcg@10"] > state.best["ndcg@10"]:
            state.best = {"ndcg@10": metrics["full"]["ndcg@10"], "epoch": epoch}
            # A copy on every rank (the models are equal): a new rank gets it with the state.
            state.best_weights = {k: v.detach().cpu().clone()
                                  for k, v in run_.model.state_dict().items()}
        if dist.is_root():
            log_validation(run_.writer, metrics, state.step, out, record)
    state.epoch, state.rows = epoch, 0
