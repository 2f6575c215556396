"""One rank's part of a training run, the same whichever route drives it.

`Trainer` holds the model, its optimizer and schedule, and does what every route does: one
optimizer step, logging averaged over ranks, validation combined over ranks, checkpoints and the
final model. The routes differ only in how they walk the data: hvd_ctsm.train goes epoch by epoch
over a fixed plan (horovodrun, torchrun, horovod.spark), hvd_ctsm.train.elastic_loop over a global
order that survives a change of world size (Elastic Horovod).

Rank 0 alone writes: config.yaml, TensorBoard (and the MLflow run, hvd_ctsm.tracking),
checkpoints, metrics.jsonl, train_log.jsonl, model.pt and train_summary.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from hvd_ctsm import distributed as dist
from hvd_ctsm import tracking
from hvd_ctsm.config import TrainConfig, save_config, to_dict
from hvd_ctsm.config.types import check
from hvd_ctsm.data.batches import EpochPlan, eval_batches
from hvd_ctsm.data.dataset import Dataset
from hvd_ctsm.evaluation.evaluate import evaluate, model_scorer
from hvd_ctsm.files import outputs
from hvd_ctsm.files.atomic import append_line, atomic_write_bytes
from hvd_ctsm.model.catalog import ITEM_CHUNK
from hvd_ctsm.model.checkpoint import CheckpointManager, save_state
from hvd_ctsm.model.ctsm import CTSM, ModelSizes
from hvd_ctsm.train import faults, lazy_rows
from hvd_ctsm.train.cpu_memory import keep_freed_memory
from hvd_ctsm.train.support import (StepTimer, autocast_for, build_model_sizes, parameter_checksum,
                                    set_schedule)
from hvd_ctsm.train.weight_average import WeightAverage

log = logging.getLogger("hvd_ctsm.train")


def start_rank(cfg: TrainConfig) -> tuple[Dataset, torch.device, CTSM]:
    """The dataset, the backend started, and this rank's model (same seed everywhere)."""
    dataset = Dataset.open(cfg.data.path)  # a bad dataset stops here, before any collective
    dist.start(cfg.dist.backend, cfg.dist.threads_per_rank, cfg.dist.fusion_threshold_mb,
               cfg.dist.cycle_time_ms)
    device = torch.device(f"cuda:{dist.local_rank()}" if torch.cuda.is_available() else "cpu")
    keep = cfg.dist.keep_freed_memory
    if keep or (keep is None and device.type == "cpu"):
        keep_freed_memory()
    torch.manual_seed(cfg.seed)
    sizes = build_model_sizes(dataset, cfg.model.item_category, cfg.model.item_tags)
    model = CTSM(sizes, cfg.model)
    loss = model.heads["next_item"].loss_kind if "next_item" in model.heads else None
    sparse = cfg.dist.sparse_gradients
    sparse = loss == "shared" if sparse is None else sparse
    check(not sparse or loss == "shared", "dist.sparse_gradients=true needs the shared next-item "
          "loss (model.loss=shared, or auto above 25,000 items): the others read the whole item "
          "table")
    check(not sparse or cfg.dist.compression == "none", "dist.compression=fp16 compresses dense "
          "gradients only: set dist.sparse_gradients=false, or dist.compression=none")
    if sparse:
        model.encoder.use_sparse_gradients()
    return dataset, device, model.to(device)


def describe_loss(cfg: TrainConfig, model: CTSM) -> str:
    """The log line that says which next-item loss 'auto' chose and how item gradients move."""
    if "next_item" not in model.heads:
        return "no next-item head"
    sparse = model.encoder.item.sparse
    kind = model.heads["next_item"].loss_kind
    blocks = ", in blocks of rows" if kind == "full" and model.sizes.num_items > ITEM_CHUNK else ""
    return (f"next-item loss: {LOSS_NAMES[kind]}{blocks} (model.loss="
            f"{cfg.model.loss}, {model.sizes.num_items:,} items); item gradients exchanged "
            + ("sparsely (the rows a step touched)" if sparse else "densely")
            + lazy_rows.describe(cfg.optim.lazy_rows, sparse))


def patience_evals(cfg: TrainConfig, rows_per_epoch: float) -> int:
    """Validations without a better NDCG@10 before early stopping: early_stop_evals, or the
    fewer (not under 2) whose epochs read early_stop_rows training rows."""
    most = cfg.early_stop_evals
    if not cfg.early_stop_rows:
        return most
    enough = math.ceil(cfg.early_stop_rows / max(rows_per_epoch * cfg.eval_every_epochs, 1))
    return max(min(2, most), min(most, enough))


def save_model(path: Path, weights: dict, sizes: ModelSizes, config: dict,
               vocab_sha256: str) -> None:
    """model.pt: the weights and what rebuilds and checks them (the backtest, scoring and warm
    starts read it)."""
    # A shallow dict: asdict() deep-copies the per-item lists one element at a time (4.6 s at
    # 10^6 items, measured), and nothing here changes them.
    fields = {f.name: getattr(sizes, f.name) for f in dataclasses.fields(sizes)}
    save_state(path, {"model": weights, "sizes": fields, "config": config,
                      "vocab_sha256": vocab_sha256})


class GradientBytes:
    """What a rank puts into the gradient exchange each step, before compression: every dense
    gradient whole, and of a sparse table (dist.sparse_gradients) the rows the last backward
    touched with their indices; beside it what a dense exchange of the same model moves."""

    def __init__(self, model: torch.nn.Module, sparse_tables: list[torch.nn.Embedding]):
        sparse_ids = {id(t.weight) for t in sparse_tables}
        trained = [p for p in model.parameters() if p.requires_grad]
        self.dense = sum(p.numel() * p.element_size() for p in trained if id(p) not in sparse_ids)
        self.all_dense = sum(p.numel() * p.element_size() for p in trained)
        self.tables = sparse_tables

    def last_step(self) -> dict[str, float]:
        sparse = sum(t.rows_in_gradient * (t.weight[0].numel() * t.weight.element_size() + 8)
                     for t in self.tables)
        return {"exchange/mb": (self.dense + sparse) / 2**20,
                "exchange/dense_mb": self.all_dense / 2**20}


LOSS_NAMES = {"full": "full: exact softmax over every item",
              "shared": "shared: sampled softmax over negatives shared by the batch, log-Q "
                        "corrected",
              "sampled": "sampled: sampled softmax, negatives per target",
              "bce": "bce: binary loss against sampled negatives"}


class Trainer:
    """The model, its optimizer and schedule on this rank, and the steps of training it."""

    def __init__(self, cfg: TrainConfig, dataset: Dataset, model: CTSM, device: torch.device,
                 optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR,
                 *, net: torch.nn.Module, effective_batch: int, total_steps: int,
                 plan: EpochPlan | None = None):
        self.cfg, self.dataset, self.model, self.device = cfg, dataset, model, device
        self.meta = dataset.meta
        self.optimizer, self.scheduler = optimizer, scheduler
        self.net = net  # what forward() is called on: the model, or its DDP wrapper
        self.effective_batch, self.total_steps, self.plan = effective_batch, total_steps, plan
        self.rows_per_epoch = total_steps / cfg.epochs * effective_batch  # for the patience
        self.backend = dist.current()
        self.timer = StepTimer()
        self.autocast, self.scaler = autocast_for(cfg.amp, device)
        self.out = Path(cfg.out)
        self.writer = None  # rank 0's TensorBoard/MLflow writer, from open_logs()
        decay = cfg.optim.ema_decay
        self.average = WeightAverage(model, decay, cfg.optim.base_batch_size) if decay else None
        self.grad_norm: float | None = None  # the last step's, when optim.clip_grad_norm
        self._said_no_auc = False  # p(sale) without an AUC (purchases only): logged once
        sparse = [m for m in model.modules() if isinstance(m, torch.nn.Embedding) and m.sparse]
        self.sparse_tables = [m.weight for m in sparse]
        self.exchange = GradientBytes(model, sparse)
        self.lazy_rows = (lazy_rows.LazyRows(self.optimizer, sparse)
                          if cfg.optim.lazy_rows and sparse else None)

    def open_logs(self, resume: bool) -> None:
        """Rank 0: claim the run folder, save the config, open TensorBoard (and MLflow)."""
        if not dist.is_root() or self.writer is not None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        outputs.claim(self.out, "run")  # --overwrite may replace it later (hvd_ctsm.files.outputs)
        save_config(self.cfg, self.out / "config.yaml")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = tracking.metrics_writer(
            SummaryWriter(str(self.out / "tensorboard")), self.cfg, self.meta,
            self.backend.name, dist.size(), resume)

    @contextlib.contextmanager
    def logs_ended_on_failure(self) -> Iterator[None]:
        """A training that raises ends rank 0's logs at once: TensorBoard closed, the MLflow run
        FAILED (KILLED on Ctrl-C), said in a line before the error's. The exit hook did it only
        when the process ended: a notebook that called the trainer showed its run RUNNING
        until the kernel ended."""
        try:
            yield
        except BaseException as failure:
            if self.writer is not None:
                writer, self.writer = self.writer, None
                try:
                    writer.__exit__(type(failure), failure, failure.__traceback__)
                except Exception as exc:  # noqa: BLE001  (a full disk) the failure is the line
                    log.warning("the run's logs could not be closed (%s: %s)",
                                type(exc).__name__, exc)
            raise

    def step(self, batches: Iterator[dict]) -> dict:
        """backward_passes_per_step micro-batches, one gradient reduction, one optimizer step;
        returns this rank's losses by head. (A peer that vanished mid-step is reported by the
        loop around it: faults.peer_loss_reported.)"""
        cfg, timer, backend = self.cfg, self.timer, self.backend
        micro = cfg.dist.backward_passes_per_step
        losses: dict[str, float] = {}
        for table in self.sparse_tables:  # a zero dense grad (zero_grad, the optimizer state's
            table.grad = None             # creation) would turn the sparse ones dense
        for i in range(micro):
            with timer("data"):
                batch = {k: v.to(self.device, non_blocking=True) for k, v in next(batches).items()}
            with backend.accumulating(self.net, last=i == micro - 1):
                with timer("forward"), self.autocast():
                    head_losses = self.net(batch)
                    loss = sum(cfg.model.head_weights[k] * v for k, v in head_losses.items())
                with timer("backward"):
                    self.scaler.scale(loss / micro).backward()
            for k, v in head_losses.items():
                losses[k] = losses.get(k, 0.0) + v.item() / micro
        with timer("allreduce"):  # waiting for the averaged gradients (DDP: done in backward)
            backend.finish_gradient_reduce(self.optimizer, cfg.dist.sleeping_wait)
        with timer("step"):
            self.scaler.unscale_(self.optimizer)
            rows = self._take_sparse_gradients()
            if cfg.optim.clip_grad_norm:  # the norm of the averaged gradient, before clipping
                self.grad_norm = float(lazy_rows.clip_grad_norm_(
                    self.model.parameters(), list(rows.values()), cfg.optim.clip_grad_norm))
            lazy_rows.scaled_step(self.scaler, self.optimizer, self.lazy_rows, rows,
                                  backend.stepping)
            self.optimizer.zero_grad()  # Horovod's takes no set_to_none
            self.scheduler.step()
            if self.average:
                self.settle_rows()
                self.average.update(self.model, rows=self.effective_batch)
        return losses

    def settle_rows(self) -> None:
        """With optim.lazy_rows, bring every row of the item tables up to date: before
        anything reads whole tables (validation, checkpoints, the model, an elastic commit)."""
        if self.lazy_rows:
            self.lazy_rows.settle()

    def _take_sparse_gradients(self) -> dict:
        """The sparse tables' exchanged gradients: with optim.lazy_rows taken off as rows for
        LazyRows.step; otherwise made dense in place for AdamW's own step."""
        if self.lazy_rows:
            return lazy_rows.take_row_gradients(self.sparse_tables)
        for table in self.sparse_tables:
            if table.grad is not None and table.grad.is_sparse:
                table.grad = table.grad.to_dense()
        return {}

    def log(self, step: int, losses: dict, bar) -> None:
        """Average losses and time shares over ranks (a collective), then rank 0 logs them."""
        logged = dist.allreduce_mean({f"loss/{k}": v for k, v in losses.items()}
                                     | self.timer.shares())
        if self.grad_norm is not None:  # the last step's; every rank has the same gradient
            logged["grad_norm"] = self.grad_norm
        logged |= self.exchange.last_step()
        per_rank = dist.allgather_object(self.timer.busy_and_wait())  # a straggler shows by rank
        if dist.is_root():
            rate = self.effective_batch / max(logged["time/step_seconds"], 1e-9)
            stragglers = faults.step_time_report(*map(list, zip(*per_rank, strict=True)))
            if stragglers["slow_ranks"]:
                log.warning("step %d: slow rank(s) %s: busy seconds per step by rank %s", step,
                            stragglers["slow_ranks"], stragglers["busy_s_by_rank"])
            record = logged | {"lr": self.scheduler.get_last_lr()[0], "samples_per_s": rate}
            for key, value in record.items():
                self.writer.add_scalar(key, value, step)
            append_line(self.out / "train_log.jsonl",
                        json.dumps({"step": step} | record | {"step_time": stragglers}))
            bar.set_postfix(loss=f"{logged['loss/next_item']:.3f}", rows_s=f"{rate:.0f}")
        self.timer.reset()

    def validate(self, record: dict) -> dict:
        """Ranking and sale metrics on the validation split, sharded over ranks and combined
        exactly (sums and counts over ranks, all labels gathered); rank 0 logs them with
        `record` (epoch, step, ...) to TensorBoard and metrics.jsonl."""
        self.settle_rows()
        self.model.eval()
        batches = eval_batches(self.dataset.split("validation"), dist.rank(),
                               dist.size(), batch_size=256, max_len=self.model.sizes.max_len)
        with self.averaged():
            result = evaluate(batches, model_scorer(self.model, self.device),
                              self.model.sizes.num_items, seed=self.cfg.seed)
        self.model.train()
        vector = dist.allreduce_sum(torch.tensor(result.ranking_vector()), name="val_sums")
        labels = dist.allgather_object(result.labels)
        probs = dist.allgather_object(result.probs)
        metrics = result.summary(vector.tolist(), _concat(labels), _concat(probs))
        if dist.is_root():
            self._log_validation(metrics, record | metrics)
        return metrics

    def averaged(self):
        """Inside the block the model holds the weights that are validated and kept: the
        average of the weights with optim.ema_decay, else the weights themselves."""
        return self.average.applied(self.model) if self.average else contextlib.nullcontext()

    def no_longer_improving(self, best: dict, epoch: int) -> bool:
        """early_stop_evals validations in a row without a better NDCG@10 (the same on every
        rank: validation metrics are combined over ranks), counted from the anneal if any."""
        cfg = self.cfg
        if not cfg.early_stop_evals or "epoch" not in best or epoch >= cfg.epochs:
            return False
        if cfg.anneal_after_evals and "annealed_at" not in best:
            return False  # the plateau anneals first (anneal_due)
        since = max(best["epoch"], best.get("annealed_at", 0))
        return epoch - since >= patience_evals(cfg, self.rows_per_epoch) * cfg.eval_every_epochs

    def anneal_due(self, best: dict, epoch: int) -> bool:
        """anneal_after_evals validations in a row without a better NDCG@10, not annealed yet."""
        cfg = self.cfg
        if not cfg.anneal_after_evals or "epoch" not in best or "annealed_at" in best:
            return False
        return epoch < cfg.epochs and \
            epoch - best["epoch"] >= cfg.anneal_after_evals * cfg.eval_every_epochs

    def lower_lr(self) -> None:
        """From now on the schedule's lr times anneal_lr_factor: the factor goes into the
        scheduler's base lrs, which its checkpointed state carries, so a resume keeps it."""
        set_schedule(self.scheduler,
                     [lr * self.cfg.anneal_lr_factor for lr in self.scheduler.base_lrs],
                     self.scheduler.last_epoch)

    def checkpoint(self, checkpoints: CheckpointManager, position: dict,
                   is_best: bool = False) -> None:
        """A collective (every rank's RNG state is gathered, for an exact resume); rank 0
        writes it."""
        self.settle_rows()
        rng = dist.allgather_object(torch.get_rng_state())
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(),
                 "position": position | {"rng": rng, "effective_batch": self.effective_batch},
                 "config": to_dict(self.cfg), "vocab_sha256": self.meta.vocab_sha256}
        if self.average:
            state["weight_average"] = self.average.state_dict()
        if dist.is_root():
            checkpoints.save(state, position["step"], is_best=is_best)

    def finish(self, summary: dict, load_best: Callable[[], int | None]) -> dict:
        """Check that the ranks ended in sync; rank 0 makes the best validated weights the model
        (`load_best` loads them and returns their epoch, None to keep the last) and writes
        model.pt and train_summary.json. Returns the summary."""
        self.settle_rows()
        checksums = dist.allgather_object(parameter_checksum(self.model))
        summary = summary | {"ranks": dist.size(), "effective_batch": self.effective_batch,
                             "parameter_checksums": checksums}
        if dist.is_root():
            summary["model_epoch"] = load_best()
            if summary["model_epoch"] is None and self.average:
                self.model.load_state_dict(self.average.shadow)  # the last average is the model
            save_model(self.out / "model.pt", self.model.state_dict(), self.model.sizes,
                       to_dict(self.cfg), self.meta.vocab_sha256)
            atomic_write_bytes(self.out / "train_summary.json",
                               json.dumps(summary, indent=2).encode())
            self.writer.close()
            self.writer = None  # its run is FINISHED: a failure after this leaves it so
            in_sync = len(set(checksums)) == 1
            epoch, best = summary["model_epoch"], summary["best"].get("ndcg@10")
            kept = (f"epoch {epoch}'s weights (the best validation NDCG@10, {best:.4f})"
                    if epoch is not None else "the last weights")
            steps = summary["steps"]
            log.info("done after %d step%s: %s in %s; ranks in sync: %s", steps,
                     "" if steps == 1 else "s", kept, self.out / "model.pt", in_sync)
            if not in_sync:  # every rank took the same steps from the same start: a bug
                log.warning("the ranks ended with different weights (train_summary.json); the "
                            "model is rank 0's. Please report it with the run's config.yaml")
        return summary

    def _log_validation(self, metrics: dict, record: dict) -> None:
        step = record["step"]
        for protocol in ("full", "sampled"):
            for key, value in metrics[protocol].items():
                self.writer.add_scalar(f"val_{protocol}/{key}", value, step)
        for key, value in metrics.get("sale", {}).items():
            if key == "auc_undefined":  # said once, in words, instead of a NaN every epoch
                if not self._said_no_auc:
                    log.info("p(sale) has no AUC here: %s", value)
                    self._said_no_auc = True
                continue
            self.writer.add_scalar(f"val_sale/{key}", value, step)
        append_line(self.out / "metrics.jsonl", json.dumps(record))
        log.info("epoch %d val full ndcg@10=%.4f hr@10=%.4f | sampled ndcg@10=%.4f hr@10=%.4f",
                 record["epoch"], metrics["full"]["ndcg@10"], metrics["full"]["hr@10"],
                 metrics["sampled"]["ndcg@10"], metrics["sampled"]["hr@10"])


def _concat(per_rank: list[list[np.ndarray]]) -> np.ndarray:
    arrays = [a for arrays in per_rank for a in arrays]
    return np.concatenate(arrays) if arrays else np.zeros(0)
