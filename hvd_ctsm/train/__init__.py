"""Train a CTSM on one rank or many (the program, its options and routes: hvd_ctsm.launch):

    python -m hvd_ctsm.train --data DIR --out RUN                      # one rank
    horovodrun -np 8 python -m hvd_ctsm.train --data DIR --out RUN     # eight ranks, Horovod
    torchrun --standalone --nproc-per-node 8 -m hvd_ctsm.train ...     # eight ranks, DDP
    ... --config ml100k optim.lr=0.002 epochs=30 --resume

Every rank reads its own shard and runs the same number of steps; gradients are averaged by the
backend hvd_ctsm.distributed started (dist.backend); rank 0 alone writes checkpoints, TensorBoard
(and the MLflow run, hvd_ctsm.tracking) and the final model, the same files whichever backend
trained.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from hvd_ctsm import distributed as dist
from hvd_ctsm import faults, tracking
from hvd_ctsm.atomic import atomic_write_bytes
from hvd_ctsm.checkpoint import CheckpointManager, load_state, save_state
from hvd_ctsm.config import TrainConfig, save_config, to_dict
from hvd_ctsm.data import (EpochPlan, eval_batches, plan_epoch, prefetch, read_metadata, split_url,
                           train_batches)
from hvd_ctsm.evaluate import evaluate, model_scorer
from hvd_ctsm.model import CTSM, ModelSizes
from hvd_ctsm.outputs import claim
from hvd_ctsm.train_support import (StepTimer, autocast_for, build_model_sizes, lr_scale,
                                    lr_schedule, progress_bar, restore, split_batch, warm_start)

log = logging.getLogger("hvd_ctsm.train")


def build_model(cfg: TrainConfig, sizes: ModelSizes) -> CTSM:
    return CTSM.from_config(sizes, asdict(cfg.model))


def validate(model, cfg, meta, device) -> dict:
    """Sharded validation, combined exactly: sums and counts over ranks, all labels gathered."""
    model.eval()
    batches = eval_batches(split_url(cfg.data.path, "validation"), dist.rank(), dist.size(),
                           batch_size=256, max_len=int(meta["max_len"]))
    result = evaluate(batches, model_scorer(model, device), int(meta["vocab"]["items"]),
                      seed=cfg.seed)
    model.train()
    vector = dist.allreduce_sum(torch.tensor(result.ranking_vector()), name="val_sums")
    labels = dist.allgather_object(result.labels)
    probs = dist.allgather_object(result.probs)
    return result.summary(vector.tolist(), _concat(labels), _concat(probs))


def _concat(per_rank: list[list[np.ndarray]]) -> np.ndarray:
    arrays = [a for arrays in per_rank for a in arrays]
    return np.concatenate(arrays) if arrays else np.zeros(0)


def checkpoint_state(model, optimizer, scheduler, position: dict, cfg, meta) -> dict:
    """Collective (every rank calls it): gathers each rank's RNG state for an exact resume."""
    rng = dist.allgather_object(torch.get_rng_state())
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "position": position | {"rng": rng},
            "config": to_dict(cfg), "vocab_sha256": meta.get("vocab_sha256", "")}


def save_final_model(out: Path, model, cfg, meta, summary: dict) -> None:
    save_state(out / "model.pt", {"model": model.state_dict(), "sizes": asdict(model.sizes),
                                  "config": to_dict(cfg),
                                  "vocab_sha256": meta.get("vocab_sha256", "")})
    atomic_write_bytes(out / "train_summary.json", json.dumps(summary, indent=2).encode())


@dataclass
class Run:
    """What one training run holds while it goes."""

    cfg: TrainConfig
    meta: dict
    model: CTSM  # the model itself: its state_dict is what checkpoints hold
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    plan: EpochPlan
    device: torch.device
    effective_batch: int
    total_steps: int
    writer: object = None
    timer: StepTimer = field(default_factory=StepTimer)
    backend: dist.Backend = None
    net: torch.nn.Module = None  # what forward() is called on: the model, or its DDP wrapper

    def __post_init__(self):
        self.backend = self.backend or dist.current()
        self.net = self.net or self.model


def log_training(run: Run, step: int, losses: dict, bar) -> None:
    """Average losses and time shares over ranks (a collective), then rank 0 logs them."""
    logged = dist.allreduce_mean({f"loss/{k}": v for k, v in losses.items()} | run.timer.shares())
    per_rank = dist.allgather_object(run.timer.busy_and_wait())  # a straggler shows by rank
    if dist.is_root():
        rate = run.effective_batch / max(logged["time/step_seconds"], 1e-9)
        stragglers = faults.step_time_report(*map(list, zip(*per_rank, strict=True)))
        if stragglers["slow_ranks"]:
            log.warning("step %d: slow rank(s) %s: busy seconds per step by rank %s", step,
                        stragglers["slow_ranks"], stragglers["busy_s_by_rank"])
        record = logged | {"lr": run.scheduler.get_last_lr()[0], "samples_per_s": rate}
        for key, value in record.items():
            run.writer.add_scalar(key, value, step)
        with open(Path(run.cfg.out) / "train_log.jsonl", "a") as f:
            f.write(json.dumps({"step": step} | record | {"step_time": stragglers}) + "\n")
        bar.set_postfix(loss=f"{logged['loss/next_item']:.3f}", rows_s=f"{rate:.0f}")
    run.timer.reset()


def optimizer_step(run: Run, batches, autocast, scaler) -> dict:
    """backward_passes_per_step micro-batches, one gradient reduction, one optimizer step."""
    cfg, timer, backend = run.cfg, run.timer, run.backend
    micro = cfg.dist.backward_passes_per_step
    losses = {}
    for i in range(micro):
        with timer("data"):
            batch = {k: v.to(run.device, non_blocking=True) for k, v in next(batches).items()}
        with backend.accumulating(run.net, last=i == micro - 1):
            with timer("forward"), autocast():
                head_losses = run.net(batch)
                loss = sum(cfg.model.head_weights[k] * v for k, v in head_losses.items())
            with timer("backward"):
                scaler.scale(loss / micro).backward()
        for k, v in head_losses.items():
            losses[k] = losses.get(k, 0.0) + v.item() / micro
    with timer("allreduce"):  # waiting for the averaged gradients (DDP: done in backward)
        backend.finish_gradient_reduce(run.optimizer, cfg.dist.sleeping_wait)
    with timer("step"):
        scaler.unscale_(run.optimizer)
        if cfg.optim.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.optim.clip_grad_norm)
        with backend.stepping(run.optimizer):
            scaler.step(run.optimizer)
        scaler.update()
        run.optimizer.zero_grad()  # Horovod's takes no set_to_none
        run.scheduler.step()
    return losses


def parameter_checksum(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def start_rank(cfg: TrainConfig) -> tuple[dict, torch.device, CTSM]:
    """The dataset's metadata, the backend started, and this rank's model (same seed
    everywhere)."""
    meta = read_metadata(cfg.data.path)  # a bad dataset stops here, before any collective
    dist.start(cfg.dist.backend, cfg.dist.threads_per_rank, cfg.dist.fusion_threshold_mb,
               cfg.dist.cycle_time_ms)
    device = torch.device(f"cuda:{dist.local_rank()}" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(cfg.seed)
    return meta, device, build_model(cfg, build_model_sizes(meta)).to(device)


def setup_run(cfg: TrainConfig, resume: bool, init_from: str | None) -> tuple[Run, dict]:
    """Model, optimizer and schedule on every rank, started from rank 0's state."""
    meta, device, model = start_rank(cfg)
    micro = cfg.dist.backward_passes_per_step
    plan = plan_epoch(split_url(cfg.data.path, "train"), dist.size(), cfg.data.batch_size * micro,
                      cfg.data.balance)
    total_steps = plan.steps * cfg.epochs
    effective_batch = cfg.data.batch_size * dist.size() * micro
    scale = lr_scale(cfg.optim, effective_batch)
    net, optimizer = dist.current().wrap(
        model, torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr * scale,
                                 weight_decay=cfg.optim.weight_decay), cfg.dist)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_schedule(cfg.optim, scale, total_steps))
    run = Run(cfg, meta, model, optimizer, scheduler, plan, device, effective_batch, total_steps,
              net=net)
    position = {"epoch": 0, "batch": 0, "step": 0, "best": {"ndcg@10": float("-inf")}}
    checkpoints = CheckpointManager(Path(cfg.out) / "checkpoints", cfg.keep_checkpoints)
    if resume:
        position = restore(checkpoints, model, optimizer, scheduler, meta, dist.is_root()) \
            or position
    elif init_from:
        warm_start(model, init_from, dist.is_root())
    dist.broadcast_state(model, optimizer)
    position = dist.broadcast_object(position)
    scheduler.load_state_dict(dist.broadcast_object(scheduler.state_dict()))
    if len(position.get("rng", [])) == dist.size():  # same world size: continue each RNG
        torch.set_rng_state(position["rng"][dist.rank()])
    if dist.is_root():
        Path(cfg.out).mkdir(parents=True, exist_ok=True)
        claim(Path(cfg.out), "run")
        save_config(cfg, Path(cfg.out) / "config.yaml")
        from torch.utils.tensorboard import SummaryWriter

        run.writer = tracking.metrics_writer(  # TensorBoard, and MLflow unless it is off
            SummaryWriter(str(Path(cfg.out) / "tensorboard")), cfg, meta, run.backend.name,
            dist.size(), resume)
        log.info("backend=%s ranks=%d steps/epoch=%d (shard rows %s) effective batch=%d "
                 "lr x%.3g", run.backend.name, dist.size(), plan.steps, plan.rows_per_shard,
                 effective_batch, scale)
        if plan.target_budget:
            log.info("batches balanced by targets: >= %d per batch (shard targets %s)",
                     plan.target_budget, plan.targets_per_shard)
    return run, position


def train(cfg: TrainConfig, resume: bool = False, init_from: str | None = None) -> dict:
    run, position = setup_run(cfg, resume, init_from)
    out, root = Path(cfg.out), dist.is_root()
    checkpoints = CheckpointManager(out / "checkpoints", cfg.keep_checkpoints)
    autocast, scaler = autocast_for(cfg.amp, run.device)
    bar = progress_bar(root and cfg.progress, run.total_steps, position["step"])
    step, best, history = position["step"], position["best"], []
    stop_at = min(run.total_steps, cfg.max_steps or run.total_steps)
    run.model.train()
    if position["epoch"] < cfg.epochs:
        batches = epoch_batches(run, position["epoch"], skip=position["batch"])
    upcoming = None  # the next epoch's batches, once its reader is open
    for epoch in range(position["epoch"], cfg.epochs):
        done = position["batch"] if epoch == position["epoch"] else 0  # optimizer steps
        while done < run.plan.steps and step < stop_at:
            losses = optimizer_step(run, batches, autocast, scaler)
            step, done = step + 1, done + 1
            if upcoming is None and read_ahead_now(run, epoch, done, step, stop_at):
                upcoming = epoch_batches(run, epoch + 1, skip=0)
            bar.update(1)
            if step % cfg.log_every_steps == 0 or step == stop_at:
                log_training(run, step, losses, bar)
            if cfg.checkpoint_every_steps and step % cfg.checkpoint_every_steps == 0 \
                    and done < run.plan.steps:
                save_checkpoint(run, checkpoints, {"epoch": epoch, "batch": done, "step": step,
                                                   "best": best})
        if done < run.plan.steps:  # stopped by max_steps: keep the exact position
            save_checkpoint(run, checkpoints, {"epoch": epoch, "batch": done, "step": step,
                                               "best": best})
            break
        if epoch + 1 < cfg.epochs:
            batches, upcoming = upcoming or epoch_batches(run, epoch + 1, skip=0), None
        is_best = False
        if (epoch + 1) % cfg.eval_every_epochs == 0 or epoch + 1 == cfg.epochs:
            metrics = validate(run.model, cfg, run.meta, run.device)
            is_best = metrics["full"]["ndcg@10"] > best["ndcg@10"]
            if is_best:
                best = {"ndcg@10": metrics["full"]["ndcg@10"], "epoch": epoch + 1}
            history.append({"epoch": epoch + 1, "step": step, **metrics})
            if root:
                log_validation(run.writer, metrics, step, out, history[-1])
        save_checkpoint(run, checkpoints, {"epoch": epoch + 1, "batch": 0, "step": step,
                                           "best": best}, is_best)
        if no_longer_improving(cfg, best, epoch + 1):
            log.info("early stop after epoch %d: no better validation since epoch %d",
                     epoch + 1, best["epoch"])
            break
    bar.close()
    checksums = dist.allgather_object(parameter_checksum(run.model))
    summary = {"steps": step, "ranks": dist.size(), "effective_batch": run.effective_batch,
               "steps_per_epoch": run.plan.steps, "best": best,
               "validation": history[-1] if history else None, "parameter_checksums": checksums}
    if root:
        summary["model_epoch"] = keep_best_weights(run.model, checkpoints, best)
        save_final_model(out, run.model, cfg, run.meta, summary)
        run.writer.close()
        log.info("done after %d steps; ranks in sync: %s", step, len(set(checksums)) == 1)
    return summary


def no_longer_improving(cfg: TrainConfig, best: dict, epoch: int) -> bool:
    """early_stop_evals validations in a row without a better NDCG@10 (same on every rank:
    validation metrics are combined over ranks)."""
    if not cfg.early_stop_evals or "epoch" not in best or epoch >= cfg.epochs:
        return False
    return epoch - best["epoch"] >= cfg.early_stop_evals * cfg.eval_every_epochs


def keep_best_weights(model, checkpoints: CheckpointManager, best: dict) -> int | None:
    """Load the best validated weights (checkpoints/best.pt) into `model`, so that model.pt is
    the best model, not the last; returns its epoch (None: never validated, the last is kept)."""
    path = checkpoints.folder / "best.pt"
    if "epoch" not in best or not path.exists():
        return None
    model.load_state_dict(load_state(path)["model"])
    return best["epoch"]


def read_ahead_now(run: Run, epoch: int, done: int, step: int, stop_at: int) -> bool:
    """Time to open the next epoch's reader: data.read_ahead_steps before this epoch ends (at
    its end with 0), if there is a next epoch and the run will train in it (max_steps)."""
    left = run.plan.steps - done
    return (epoch + 1 < run.cfg.epochs and left <= run.cfg.data.read_ahead_steps
            and step + left < stop_at)


def epoch_batches(run: Run, epoch: int, skip: int):
    """This rank's micro-batches of one epoch, produced ahead by a thread that starts now."""
    cfg, micro = run.cfg, run.cfg.dist.backward_passes_per_step
    batches = train_batches(split_url(cfg.data.path, "train"), dist.rank(), dist.size(), epoch,
                            run.plan, cfg.data.batch_size * micro, run.model.sizes.max_len,
                            cfg.seed, cfg.data.shuffle_buffer, skip=skip)
    batches = prefetch((chunk for big in batches for chunk in split_batch(big, micro)),
                       cfg.data.prefetch_batches)
    return faults.delayed(batches, dist.rank())  # a test's slow rank (hvd_ctsm.faults)


def save_checkpoint(run: Run, checkpoints: CheckpointManager, position: dict,
                    is_best: bool = False) -> None:
    state = checkpoint_state(run.model, run.optimizer, run.scheduler, position, run.cfg,
                             run.meta)
    if dist.is_root():
        checkpoints.save(state, position["step"], is_best=is_best)


def log_validation(writer, metrics: dict, step: int, out: Path, record: dict) -> None:
    for protocol in ("full", "sampled"):
        for key, value in metrics[protocol].items():
            writer.add_scalar(f"val_{protocol}/{key}", value, step)
    for key, value in metrics.get("sale", {}).items():
        writer.add_scalar(f"val_sale/{key}", value, step)
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    log.info("epoch %d val full ndcg@10=%.4f hr@10=%.4f | sampled ndcg@10=%.4f hr@10=%.4f",
             record["epoch"], metrics["full"]["ndcg@10"], metrics["full"]["hr@10"],
             metrics["sampled"]["ndcg@10"], metrics["sampled"]["hr@10"])

