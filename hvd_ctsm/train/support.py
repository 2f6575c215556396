"""The trainer's helpers: learning-rate rules, timers, mixed precision, resume and warm start,
micro-batches, and the checks a launch passes before any worker starts its backend."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import sys
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from hvd_ctsm import distributed as dist
from hvd_ctsm.config import ConfigError, OptimConfig, TrainConfig, as_override
from hvd_ctsm.data.dataset import Dataset
from hvd_ctsm.data.dataset_meta import DatasetMeta, check_same_vocabulary
from hvd_ctsm.model.checkpoint import CheckpointManager, load_state, model_file
from hvd_ctsm.model.ctsm import ModelSizes
from hvd_ctsm.progress import Progress
from hvd_ctsm.train import faults

log = logging.getLogger("hvd_ctsm.train")


def build_model_sizes(dataset: Dataset, categories: bool = False,
                      tags: bool = False) -> ModelSizes:
    """The model's sizes from the dataset (Dataset.sizes)."""
    return ModelSizes(**dataset.sizes(categories, tags))


def lr_scale(optim: OptimConfig, effective_batch: int) -> float:
    """How much the peak lr grows with the effective batch (Goyal et al.: linear; or sqrt)."""
    ratio = effective_batch / optim.base_batch_size
    return {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[optim.lr_scaling]


# optim.item_weight_decay=auto: this decay on the item table where the training split has fewer
# than SPARSE_TARGETS_PER_ITEM targets per catalog item, none elsewhere. It raised full and
# sampled NDCG@10 on every shape measured below 8 (5.0 to 7.1) and traded one for the other at
# 8.9 and above (benchmarks/QUALITY.md, "Item decay below 8 targets per item").
SPARSE_TARGETS_PER_ITEM = 8
SPARSE_ITEM_WEIGHT_DECAY = 5.0


def resolve_item_weight_decay(value: float | str | None,
                              targets_per_item: float) -> float | None:
    """The item table's decay optim.item_weight_decay stands for on this training split."""
    if value != "auto":
        return value
    return SPARSE_ITEM_WEIGHT_DECAY if targets_per_item < SPARSE_TARGETS_PER_ITEM else None


def with_item_decay_resolved(cfg: TrainConfig, meta: DatasetMeta,
                             announce: bool = False) -> TrainConfig:
    """`cfg` with optim.item_weight_decay=auto replaced by what it stands for on this dataset
    (so the run's saved config says what trained); `announce` logs the line that says so."""
    if cfg.optim.item_weight_decay != "auto":
        return cfg
    per_item = meta.train_targets_per_item
    decay = resolve_item_weight_decay("auto", per_item)
    if announce:
        log.info("item table decay: %s (optim.item_weight_decay=auto, %.1f training targets "
                 "an item, %s %d)", "none" if decay is None else f"{decay:g}", per_item,
                 "under" if decay else "not under", SPARSE_TARGETS_PER_ITEM)
    return dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim,
                                                              item_weight_decay=decay))


def make_optimizer(model: torch.nn.Module, optim: OptimConfig, lr: float) -> torch.optim.AdamW:
    """AdamW over every parameter; with optim.item_weight_decay set, the item table is a second
    parameter group with that decay (a checkpoint's optimizer state then has two groups, and
    resumes only under a config that also sets it)."""
    betas = (0.9, optim.adam_beta2)
    item_table = getattr(getattr(model, "encoder", None), "item", None)
    if optim.item_weight_decay == "auto":  # a bug, not a user's error
        raise ValueError("optim.item_weight_decay=auto: with_item_decay_resolved first")
    if optim.item_weight_decay is None or item_table is None:
        return torch.optim.AdamW(model.parameters(), lr=lr, betas=betas,
                                 weight_decay=optim.weight_decay)
    others = [p for p in model.parameters() if p is not item_table.weight]
    return torch.optim.AdamW([{"params": others},
                              {"params": [item_table.weight],
                               "weight_decay": optim.item_weight_decay}],
                             lr=lr, betas=betas, weight_decay=optim.weight_decay)


def lr_schedule(optim: OptimConfig, scale: float, total_steps: int):
    """Multiplier of the scaled lr per step: warm up from the unscaled lr, then cosine decay."""
    warmup = min(optim.warmup_steps, max(total_steps - 1, 0))
    start = 1.0 / scale

    def factor(step: int) -> float:
        if step < warmup:
            return start + (1.0 - start) * step / warmup
        if optim.decay == "none" or total_steps <= warmup:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return optim.min_lr_ratio + (1.0 - optim.min_lr_ratio) * cosine

    return factor


def set_schedule(scheduler, base_lrs: list[float], step: int) -> None:
    """A LambdaLR schedule from `step` on, with `base_lrs` as its peak lrs (its state carries
    them, so a resume keeps them)."""
    scheduler.base_lrs, scheduler.last_epoch = list(base_lrs), step
    for group, base, rule in zip(scheduler.optimizer.param_groups, scheduler.base_lrs,
                                 scheduler.lr_lambdas, strict=True):
        group["lr"] = base * rule(step)


class StepTimer:
    """Wall time per phase (data, forward, backward, allreduce, step), as totals and shares."""

    PHASES = ("data", "forward", "backward", "allreduce", "step")

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.totals = defaultdict(float)
        self.steps = 0

    @contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.totals[phase] += time.perf_counter() - t0
            if phase == "step":
                self.steps += 1

    def mean_step_seconds(self) -> float:
        return sum(self.totals.values()) / max(self.steps, 1)

    def busy_and_wait(self) -> tuple[float, float]:
        """Mean seconds per step spent working, and waiting in the gradient allreduce."""
        wait = self.totals["allreduce"] / max(self.steps, 1)
        return self.mean_step_seconds() - wait, wait

    def shares(self) -> dict[str, float]:
        total = sum(self.totals.values()) or 1.0
        shares = {f"time_share/{p}": self.totals[p] / total for p in self.PHASES}
        return shares | {"time/step_seconds": self.mean_step_seconds()}


def autocast_for(amp: str, device: torch.device):
    """(autocast context factory, grad scaler). fp32 on CPU; bf16 or fp16 on CUDA."""
    if device.type != "cuda" or amp == "off":
        return nullcontext, torch.amp.GradScaler("cpu", enabled=False)
    if amp == "auto":
        amp = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    return (lambda: torch.autocast("cuda", dtype=dtype)), scaler


class _NoBar:
    def update(self, n=1):
        pass

    def set_postfix(self, **kwargs):
        pass

    def close(self):
        pass


def on_a_terminal() -> bool:
    return sys.stderr.isatty()


def log_lines_above_the_bar(enabled: bool):
    """While a tqdm bar runs, log lines go through tqdm.write: each on a line of its own above
    the bar. Written by a plain handler they were glued to the end of the bar's line."""
    if not enabled or not on_a_terminal():
        return nullcontext()
    from tqdm.contrib.logging import logging_redirect_tqdm

    return logging_redirect_tqdm()


def progress_bar(enabled: bool, total: int, initial: int):
    """A tqdm bar on a terminal; where stderr is a file or a pipe (a log, spark-submit,
    horovodrun's), a line every 30 s (hvd_ctsm.progress): tqdm's bar redraws itself with
    carriage returns, which a log keeps, all in one ever longer line. Or nothing."""
    if not enabled:
        return _NoBar()
    if not on_a_terminal():
        return Progress(total, "train", "steps", initial)
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, desc="train")


def restore(checkpoints: CheckpointManager, model, optimizer, scheduler, meta: DatasetMeta,
            root: bool) -> dict | None:
    """Rank 0 loads the newest good checkpoint (the others receive it by broadcast).

    Returns the checkpoint (its "position", and "weight_average" with optim.ema_decay), or
    None when there is nothing to resume from."""
    if not root:
        return None
    state = checkpoints.load_latest()
    if state is None:
        log.warning("--resume: no checkpoint in %s, starting from scratch", checkpoints.folder)
        return None
    check_same_vocabulary(state, meta, "--resume: the checkpoint", "this dataset",
                          "use --init-from to warm-start on a new dataset instead")
    model.load_state_dict(state["model"])
    check_same_param_groups(state, optimizer)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if "effective_batch" not in state["position"]:  # saved before checkpoints recorded it
        config = state["config"]
        state["position"]["effective_batch"] = config["data"]["batch_size"] * len(
            state["position"]["rng"]) * config["dist"]["backward_passes_per_step"]
    log.info("resumed from step %d (epoch %d, step %d of the epoch)", state["position"]["step"],
             state["position"]["epoch"], state["position"]["batch"])
    return state


def check_same_param_groups(state: dict, optimizer) -> None:
    """The item table has a parameter group of its own exactly when it has a decay of its own
    (make_optimizer): a checkpoint from the other kind cannot resume, say why in one line."""
    if len(state["optimizer"]["param_groups"]) == len(optimizer.param_groups):
        return
    was = (state.get("config") or {}).get("optim", {}).get("item_weight_decay")
    setting = as_override("optim.item_weight_decay", was)
    raise ConfigError(f"--resume: the checkpoint trained with {setting}, and this run's settings "
                      f"give the item table {'a' if was is None else 'no'} decay of its own "
                      "(optim.item_weight_decay=auto decides by the training split's targets "
                      f"per item): pass {setting} to resume it, or train into a new --out")


def rebase_schedule(trainer, position: dict) -> dict:
    """A resume under another effective batch (other ranks, data.batch_size or micro-steps)
    than the checkpoint's: an epoch is then another number of steps, and the peak lr scales
    with the batch (optim.lr_scaling). From the end of an epoch the run goes on from the same
    epoch with this run's steps, its saved peak lrs (an anneal's factor included) rescaled to
    this batch; from inside an epoch the rows already trained cannot be told apart under
    another split, so it is refused. Returns the position to start from."""
    was, now = position.get("effective_batch", trainer.effective_batch), trainer.effective_batch
    if was == now:
        return position
    cfg = trainer.cfg
    if position["batch"]:
        steps, ranks = position["batch"], dist.size()
        raise SystemExit(
            f"error: --resume: the latest checkpoint is {steps} step{'s' * (steps != 1)} into "
            f"epoch {position['epoch'] + 1}, trained with an effective batch of {was} rows; this "
            f"run's is {now} ({ranks} rank{'s' * (ranks != 1)} x data.batch_size="
            f"{cfg.data.batch_size}): resume "
            f"with the ranks and batch size it had (max_steps=N can stop it at the end of an "
            f"epoch, from where another effective batch can go on), or train into a new --out")
    rescale = lr_scale(cfg.optim, now) / lr_scale(cfg.optim, was)
    step = position["epoch"] * trainer.plan.steps
    set_schedule(trainer.scheduler, [lr * rescale for lr in trainer.scheduler.base_lrs], step)
    if dist.is_root():
        log.info("--resume under an effective batch of %d (was %d): epoch %d starts at step %d "
                 "of %d, peak lr x%.3g", now, was, position["epoch"] + 1, step,
                 trainer.total_steps, rescale)
    return position | {"step": step, "effective_batch": now}


def warm_start(model, path: str, root: bool) -> None:
    """Copy an earlier model's weights; item tables grown by a retrain keep the old rows. That
    it is the same architecture was checked before the workers started
    (run_folder.check_warm_start_matches)."""
    if not root:
        return
    old = load_state(model_file(path))["model"]
    new = model.state_dict()
    copied, grown = 0, 0
    for name, tensor in old.items():
        if name not in new:
            continue
        target = new[name]
        if target.shape == tensor.shape:
            target.copy_(tensor)
            copied += 1
        elif target.dim() == tensor.dim() and all(
                t >= o for t, o in zip(target.shape, tensor.shape, strict=True)):
            target[tuple(slice(0, n) for n in tensor.shape)].copy_(tensor)
            grown += 1
        else:
            raise ValueError(f"--init-from: {name} has shape {tuple(tensor.shape)}, the new model "
                             f"{tuple(target.shape)}: not a smaller vocabulary of the same model")
    model.load_state_dict(new)
    log.info("warm start from %s: %d tensors copied, %d grown (new vocabulary rows)", path,
             copied, grown)


def split_batch(batch: dict, parts: int) -> list[dict]:
    """One read of parts x batch_size rows -> `parts` micro-batches (backward_passes_per_step)."""
    if parts == 1:
        return [batch]
    rows = batch["item"].shape[0]
    out = []
    for i in range(parts):  # every row: batches by targets or length vary in rows
        lo, hi = i * rows // parts, (i + 1) * rows // parts
        keep = (batch["target_row"] >= lo) & (batch["target_row"] < hi)
        part = {k: v[lo:hi] for k, v in batch.items() if not k.startswith("target_")}
        part |= {k: v[keep] for k, v in batch.items() if k.startswith("target_")}
        part["target_row"] = part["target_row"] - lo
        out.append(part)
    return out


def note_restart(out: Path) -> None:
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    log.warning("restart %s by torchrun after a worker failed: resuming from the latest "
                "checkpoint", count)
    if dist.launch_rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
        faults.append_event(out, {"event": "restarted_by_torchrun", "restart": int(count)})


def check_launch(cfg: TrainConfig, options) -> None:
    """The backend can serve this launch (dist.BackendError names the fix otherwise); `options`:
    hvd_ctsm.train.launch.LaunchOptions."""
    backend = dist.check_config(cfg.dist.backend, cfg.dist)
    if options.elastic and backend != "horovod":
        raise dist.BackendError("--elastic is Elastic Horovod (horovodrun); with torchrun use "
                                "--max-restarts N: restarted workers resume from the latest "
                                "checkpoint")
    if options.elastic and cfg.data.balance != "rows":
        raise ConfigError(f"data.balance={cfg.data.balance} is for the plain route; --elastic "
                          "batches by rows: drop the setting or --elastic")
    if options.elastic:  # before the run folder is checked, and --overwrite empties it
        check_elastic_config(cfg)


def check_elastic_config(cfg) -> None:
    """Settings the elastic loop does not take (ConfigError: checked at launch, before the run
    folder, which --overwrite empties: a refusal after that lost the earlier run)."""
    if cfg.dist.backward_passes_per_step != 1:
        raise ConfigError("config: --elastic trains with dist.backward_passes_per_step=1 only")
    if cfg.max_steps:
        raise ConfigError("config: --elastic has no max_steps; stop with epochs")
    if cfg.anneal_after_evals:
        raise ConfigError("config: --elastic has no anneal_after_evals yet; set it to 0")


def parameter_checksum(model: torch.nn.Module) -> str:
    """sha256 of every tensor of the model's state, by name: equal on every rank in sync."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
