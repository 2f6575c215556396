"""Train a CTSM on one rank or many (the program, its options and routes: hvd_ctsm.train.launch):

    python -m hvd_ctsm.train --data DIR --out RUN                      # one rank
    horovodrun -np 8 python -m hvd_ctsm.train --data DIR --out RUN     # eight ranks, Horovod
    torchrun --standalone --nproc-per-node 8 -m hvd_ctsm.train ...     # eight ranks, DDP
    ... --config ml100k optim.lr=0.002 epochs=30 --resume

Every rank reads its own shard and runs the same number of steps; gradients are averaged by the
backend hvd_ctsm.distributed started (dist.backend); rank 0 alone writes checkpoints, TensorBoard
(and the MLflow run, hvd_ctsm.tracking) and the final model, the same files whichever backend
trained. This module is the epoch loop; what one step, a validation or a checkpoint does is
hvd_ctsm.train.trainer's, shared with the elastic loop.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from hvd_ctsm import distributed as dist
from hvd_ctsm.config import TrainConfig
from hvd_ctsm.data.batches import plan_epoch, prefetch, train_batches
from hvd_ctsm.model.checkpoint import CheckpointError, CheckpointManager, load_state
from hvd_ctsm.train import faults
from hvd_ctsm.train.support import (log_lines_above_the_bar, lr_scale, lr_schedule, make_optimizer,
                                    progress_bar, rebase_schedule, restore, split_batch, warm_start,
                                    with_item_decay_resolved)
from hvd_ctsm.train.trainer import Trainer, describe_loss, patience_evals, start_rank

log = logging.getLogger("hvd_ctsm.train")


def train(cfg: TrainConfig, resume: bool = False, init_from: str | None = None) -> dict:
    trainer = build_trainer(cfg)
    with faults.note_on_sigterm(lambda: faults.stopped_message(cfg, trainer.model)), \
            log_lines_above_the_bar(dist.is_root() and cfg.progress), \
            faults.peer_loss_reported(cfg, trainer.model), trainer.logs_ended_on_failure():
        return run_epochs(trainer, resume, init_from)


def run_epochs(trainer: Trainer, resume: bool, init_from: str | None) -> dict:
    """The epochs from the start position (a checkpoint's with resume) to the last one, or an
    early stop; the summary trainer.finish writes."""
    cfg = trainer.cfg
    checkpoints = CheckpointManager(Path(cfg.out) / "checkpoints", cfg.keep_checkpoints)
    position = start_position(trainer, checkpoints, resume, init_from)
    finished = nothing_left(trainer, position)
    if finished and dist.is_root():
        log.info("--resume: %s: nothing left to train", finished)
    first_epoch = cfg.epochs if finished else position["epoch"]
    trainer.open_logs(resume)
    bar = progress_bar(dist.is_root() and cfg.progress, trainer.total_steps, position["step"])
    step, best = position["step"], position["best"]
    steps_per_epoch = trainer.plan.steps
    stop_at = min(trainer.total_steps, cfg.max_steps or trainer.total_steps)
    last_validation = None
    trainer.model.train()
    if first_epoch < cfg.epochs:
        batches = epoch_batches(trainer, first_epoch, skip=position["batch"])
    upcoming = None  # the next epoch's batches, once its reader is open
    for epoch in range(first_epoch, cfg.epochs):
        done = position["batch"] if epoch == first_epoch else 0  # optimizer steps
        while done < steps_per_epoch and step < stop_at:
            losses = trainer.step(batches)
            step, done = step + 1, done + 1
            if upcoming is None and read_ahead_now(trainer, epoch, done, step, stop_at):
                upcoming = epoch_batches(trainer, epoch + 1, skip=0)
            bar.update(1)
            if step % cfg.log_every_steps == 0 or step == stop_at:
                trainer.log(step, losses, bar)
            if cfg.checkpoint_every_steps and step % cfg.checkpoint_every_steps == 0 \
                    and done < steps_per_epoch:
                trainer.checkpoint(checkpoints, {"epoch": epoch, "batch": done, "step": step,
                                                 "best": best})
        if done < steps_per_epoch:  # stopped by max_steps: keep the exact position
            trainer.checkpoint(checkpoints, {"epoch": epoch, "batch": done, "step": step,
                                             "best": best})
            break
        if epoch + 1 < cfg.epochs:
            batches, upcoming = upcoming or epoch_batches(trainer, epoch + 1, skip=0), None
        is_best = False
        if (epoch + 1) % cfg.eval_every_epochs == 0 or epoch + 1 == cfg.epochs:
            metrics = trainer.validate({"epoch": epoch + 1, "step": step})
            last_validation = {"epoch": epoch + 1, "step": step, **metrics}
            is_best = metrics["full"]["ndcg@10"] > best["ndcg@10"]
            if is_best:
                best = best | {"ndcg@10": metrics["full"]["ndcg@10"], "epoch": epoch + 1}
        if trainer.anneal_due(best, epoch + 1):  # before the checkpoint, so a resume keeps it
            best = best | {"annealed_at": epoch + 1}
            anneal(trainer, checkpoints, best)
        trainer.checkpoint(checkpoints, {"epoch": epoch + 1, "batch": 0, "step": step,
                                         "best": best}, is_best)
        if trainer.no_longer_improving(best, epoch + 1):
            log.info("early stop after epoch %d: no better validation since epoch %d",
                     epoch + 1, best["epoch"])
            break
    bar.close()
    summary = {"steps": step, "steps_per_epoch": steps_per_epoch, "best": best,
               "validation": last_validation}
    return trainer.finish(summary, lambda: keep_best_weights(trainer.model, checkpoints, best))


def build_trainer(cfg: TrainConfig) -> Trainer:
    """Model, optimizer and schedule for epochs of `plan_epoch` steps on every rank."""
    dataset, device, model = start_rank(cfg)
    micro = cfg.dist.backward_passes_per_step
    plan = plan_epoch(dataset.split("train"), dist.size(), cfg.data.batch_size * micro,
                      cfg.data.balance)
    total_steps = plan.steps * cfg.epochs
    effective_batch = cfg.data.batch_size * dist.size() * micro
    scale = lr_scale(cfg.optim, effective_batch)
    # after the split's files were checked: a damaged dataset's error stays the only line
    cfg = with_item_decay_resolved(cfg, dataset.meta, announce=dist.is_root())
    net, optimizer = dist.current().wrap(
        model, make_optimizer(model, cfg.optim, cfg.optim.lr * scale), cfg.dist)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_schedule(cfg.optim, scale, total_steps))
    if dist.is_root():
        log.info("backend=%s ranks=%d steps/epoch=%d (shard rows %s) effective batch=%d "
                 "lr x%.3g", dist.current().name, dist.size(), plan.steps, plan.rows_per_shard,
                 effective_batch, scale)
        log.info(describe_loss(cfg, model))
        if plan.target_budget:
            log.info("batches balanced by targets: >= %d per batch (shard targets %s)",
                     plan.target_budget, plan.targets_per_shard)
        if plan.by_length:
            log.info("batches grouped by history length, each padded to its longest")
    trainer = Trainer(cfg, dataset, model, device, optimizer, scheduler, net=net,
                      effective_batch=effective_batch, total_steps=total_steps, plan=plan)
    if dist.is_root():
        log.info(ends_when(cfg, trainer.rows_per_epoch, total_steps))
    return trainer


def ends_when(cfg: TrainConfig, rows_per_epoch: int, total_steps: int = 0) -> str:
    """The log line that says when training ends: its epochs, or max_steps where that comes
    first (before, a run of max_steps=1 said it ended at epoch 100), or an early stop that can
    come before either (not said where it cannot)."""
    patience = patience_evals(cfg, rows_per_epoch) if cfg.early_stop_evals else 0
    epochs = patience * cfg.eval_every_epochs
    end, last_epoch = f"training ends at epoch {cfg.epochs} (epochs)", cfg.epochs
    if 0 < cfg.max_steps < total_steps:
        end = (f"training ends after step {cfg.max_steps:,} (max_steps), of the {total_steps:,} "
               f"its {cfg.epochs} epochs take")
        last_epoch = cfg.max_steps * cfg.epochs / total_steps
    if not patience or epochs >= last_epoch:
        return end
    return (f"{end}, or earlier after {patience} validations in a row without a better "
            f"NDCG@10 ({epochs} epochs, about {epochs * rows_per_epoch:,.0f} training rows)")


def nothing_left(trainer: Trainer, position: dict) -> str | None:
    """Why a resumed run has nothing left to train, or None: it has trained its epochs, or it
    had stopped early by this run's patience (before, each --resume of a run that stopped early
    trained one more epoch and stopped again)."""
    cfg, epoch, best = trainer.cfg, position["epoch"], position["best"]
    if epoch and epoch >= cfg.epochs:
        return (f"the run has trained {epoch} epoch{'s' * (epoch != 1)} (epochs={cfg.epochs}; "
                "a larger epochs=N goes on)")
    if not position["batch"] and trainer.no_longer_improving(best, epoch):
        return (f"the run stopped early after epoch {epoch} (no better validation since epoch "
                f"{best['epoch']}; a larger early_stop_evals or early_stop_rows goes on)")
    return None


def start_position(trainer: Trainer, checkpoints: CheckpointManager, resume: bool,
                   init_from: str | None) -> dict:
    """Where training starts (epoch, batch, step, best): the latest checkpoint's with --resume,
    else the beginning; every rank leaves with rank 0's weights, optimizer and schedule."""
    model, optimizer, scheduler = trainer.model, trainer.optimizer, trainer.scheduler
    position = {"epoch": 0, "batch": 0, "step": 0, "best": {"ndcg@10": float("-inf")}}
    saved = None
    if resume:
        saved = restore(checkpoints, model, optimizer, scheduler, trainer.meta, dist.is_root())
        position = saved["position"] if saved else position
    elif init_from:
        warm_start(model, init_from, dist.is_root())
    dist.broadcast_state(model, optimizer)
    position = dist.broadcast_object(position)
    scheduler.load_state_dict(dist.broadcast_object(scheduler.state_dict()))
    if resume and not nothing_left(trainer, position):  # a finished run keeps its own steps
        position = rebase_schedule(trainer, position)
    if len(position.get("rng", [])) == dist.size():  # same world size: continue each RNG
        torch.set_rng_state(position["rng"][dist.rank()])
    if trainer.average:  # the resumed run's average, else one of the weights training starts from
        trainer.average.restart(model, dist.broadcast_object(
            saved.get("weight_average") if saved else None))
    return position


def keep_best_weights(model, checkpoints: CheckpointManager, best: dict) -> int | None:
    """Load the best validated weights (checkpoints/best.pt) into `model`, so that model.pt is
    the best model, not the last; returns its epoch (None: never validated, the last is kept).
    A damaged best.pt keeps the last weights, with a warning: it ended a whole run as a crash
    without model.pt, and each --resume again (a step checkpoint loaded, best.pt unread)."""
    path = checkpoints.folder / "best.pt"
    if "epoch" not in best or not path.exists():
        return None
    try:
        state = load_state(path)
    except (CheckpointError, OSError) as exc:
        log.warning("%s; keeping the last weights instead of epoch %d's (the best validated)",
                    exc, best["epoch"])
        return None
    model.load_state_dict(checkpoint_weights(state))
    return best["epoch"]


def checkpoint_weights(state: dict) -> dict:
    """The weights a checkpoint validated: their average with optim.ema_decay, else the model's."""
    averaged = state.get("weight_average")
    return averaged["weights"] if averaged else state["model"]


def anneal(trainer: Trainer, checkpoints: CheckpointManager, best: dict) -> None:
    """Validation has stalled: every rank goes back to the best validated weights (rank 0's
    best.pt, broadcast) and trains on at a lower lr."""
    if dist.is_root():
        back = keep_best_weights(trainer.model, checkpoints, best) is not None
        log.info("no better validation since epoch %d: %s, lr x%g from epoch %d", best["epoch"],
                 "back to its weights" if back else "on from the last weights",
                 trainer.cfg.anneal_lr_factor, best["annealed_at"])
    dist.broadcast_state(trainer.model, trainer.optimizer)
    trainer.lower_lr()


def read_ahead_now(trainer: Trainer, epoch: int, done: int, step: int, stop_at: int) -> bool:
    """Time to open the next epoch's reader: data.read_ahead_steps before this epoch ends (at
    its end with 0), if there is a next epoch and the run will train in it (max_steps)."""
    left = trainer.plan.steps - done
    return (epoch + 1 < trainer.cfg.epochs and left <= trainer.cfg.data.read_ahead_steps
            and step + left < stop_at)


def epoch_batches(trainer: Trainer, epoch: int, skip: int):
    """This rank's micro-batches of one epoch, produced ahead by a thread that starts now."""
    cfg, micro = trainer.cfg, trainer.cfg.dist.backward_passes_per_step
    batches = train_batches(trainer.dataset.split("train"), dist.rank(), dist.size(), epoch,
                            trainer.plan, cfg.data.batch_size * micro, trainer.model.sizes.max_len,
                            cfg.seed, cfg.data.shuffle_buffer, skip=skip)
    batches = prefetch((chunk for big in batches for chunk in split_batch(big, micro)),
                       cfg.data.prefetch_batches)
    return faults.delayed(batches, dist.rank(), cfg.debug.step_delay_s)  # a test's slow rank
