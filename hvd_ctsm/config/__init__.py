"""Typed training configuration: dataclasses, YAML presets and `section.field=value` overrides.

    cfg = load_config("ml100k", ["optim.lr=1e-3", "epochs=30"])   # a preset name or a YAML path
    cfg, args = config_from_argv(["--data", DIR, "--config", "ml100k", "optim.lr=1e-3"])

Defaults are the dataclasses below (the model section, ModelConfig, in hvd_ctsm.config.model_config,
each of its defaults with its reason); a preset (hvd_ctsm/presets/NAME.yaml, shipped in the wheel)
overrides some of them and `section.field=value` overrides win over both (both read by
hvd_ctsm.config.sources). Every value is converted
to its field's declared type (hvd_ctsm.config.types), so `optim.lr=1e-3` is a float and
`epochs=3.7` is refused, naming the field, the value and the type; __post_init__ then checks
ranges. Either way a bad value stops the run before any worker starts. The resolved config is
saved beside each run (config.yaml).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from hvd_ctsm.config.model_config import ModelConfig
from hvd_ctsm.config.sources import apply_overrides, as_override, preset_names, read_preset
from hvd_ctsm.config.types import ConfigError, build, check, one_of
from hvd_ctsm.errors import arg_parser
from hvd_ctsm.files.atomic import atomic_write_bytes
from hvd_ctsm.files.storage import location


@dataclass
class DataConfig:
    path: str = ""
    """Folder written by the feature job (train/, validation/, test/, metadata.json)."""
    batch_size: int = 64
    """Rows (client windows) per rank per micro-step."""
    prefetch_batches: int = 2
    """Batches read and collated ahead in a background thread (0: read inline)."""
    shuffle_buffer: int = 1024
    """Rows held for in-memory shuffling; row groups are shuffled too. 0 disables row shuffling."""
    read_ahead_steps: int = 4
    """Open the next epoch's reader this many optimizer steps before the current epoch ends, so
    its shuffle buffer fills while they train (0: when the epoch ends)."""
    balance: str = "rows"
    """How a rank fills a batch: 'rows' (batch_size rows) or 'targets' (rows until a target
    budget is reached, the same on every rank, so that ranks do about the same work per step
    and wait less for each other at the allreduce; about batch_size rows on average), or
    'length' (rows of similar history length, as many as hold about batch_size rows' worth
    of targets: a batch is padded only to its longest history, so a step computes over less
    padding; every rank takes its batches in the same order of length). The plain route
    only: elastic runs batch by rows."""

    def __post_init__(self):
        check(self.batch_size >= 1, f"data.batch_size must be >= 1, got {self.batch_size}")
        check(self.prefetch_batches >= 0, "data.prefetch_batches must be >= 0")
        check(self.read_ahead_steps >= 0, "data.read_ahead_steps must be >= 0")
        check(self.shuffle_buffer >= 0, "data.shuffle_buffer must be >= 0")
        one_of("data.balance", self.balance, {"rows", "targets", "length"})


@dataclass
class OptimConfig:
    lr: float = 2e-3
    """Learning rate for an effective batch of `base_batch_size` rows."""
    base_batch_size: int = 64
    """The effective batch `lr` was tuned for; the scaling rule starts from it."""
    lr_scaling: str = "linear"
    """How lr grows with the effective batch: 'linear', 'sqrt' or 'none'. Linear with warm-up
    kept NDCG@10 within seeds' noise at 2x the batch, and at 4x given the epochs it needs
    (benchmarks/QUALITY.md, "More workers, same model"); sqrt lost 0.02-0.06 (benchmarks)."""
    warmup_steps: int = 50
    """Linear warm-up from lr (unscaled) to the scaled lr over this many optimizer steps."""
    decay: str = "cosine"
    """After warm-up: 'cosine' to min_lr_ratio * lr by the last step, or 'none'."""
    min_lr_ratio: float = 0.1
    """Floor of the cosine decay, as a fraction of the peak lr."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    item_weight_decay: float | str | None = "auto"
    """AdamW weight decay on the item table alone (the item vectors the encoder reads and the
    next-item head scores with), in place of weight_decay for it; None: weight_decay, as every
    other parameter; 'auto': 5 where the training split has fewer than 8 targets per catalog
    item, else None (hvd_ctsm.train.support.resolve_item_weight_decay; the trainer logs what
    it chose). A rare item's vector is pushed by the few events it is the target of and
    barely pulled back by the softmax, where it is a negative of tiny probability; decay pulls
    it back towards zero, which leaves its score to the item bias (its popularity). 5 validated
    higher (3 seeds each, full and sampled NDCG@10) on every shape at 5-7 training targets an
    item (six) and on ML-100K (58); at 9, 14 and 70 it cost full NDCG@10 (0.001 at 9; at 9 and
    14 it raised sampled NDCG@10 by 0.03 and 0.01), and on the synthetic set (192) too
    (benchmarks/QUALITY.md, "Decay on the item table" and after)."""
    adam_beta2: float = 0.999
    """AdamW's decay of its average of squared gradients (PyTorch's default; SASRec's authors
    used 0.98). It averages over about 1 / (1 - adam_beta2) steps: with 0.999 that is longer
    than a whole ML-100K run at np=2 (8 steps an epoch), but 0.98 validated lower there."""
    clip_grad_norm: float = 1.0
    """Clip the global gradient norm (after the allreduce); 0 disables."""
    lazy_rows: bool = True
    """With sparse item gradients (dist.sparse_gradients, the shared loss), the optimizer moves
    only the rows of the item and tag tables a step reads, each first caught up on the AdamW
    steps it missed (in closed form: the same rows as AdamW's, to float rounding), and the
    whole tables when something reads them whole (hvd_ctsm.train.lazy_rows). false: AdamW
    over the whole tables every step, which at 10^6 items was 62% of a CPU step. Nothing
    changes with dense item gradients (the exact loss)."""
    ema_decay: float = 0.0
    """Validate, and keep as the model, an exponential moving average of the weights with
    this decay per `base_batch_size` rows trained (larger batches decay it more per step), at
    most (1 + n) / (10 + n) after n steps so that the random start fades
    (hvd_ctsm.train.weight_average);
    0 disables. It is checkpointed, resumed and committed with elastic state. Off: on ML-100K
    it validated level with the weights themselves (benchmarks/results/quality_history.md)."""

    def __post_init__(self):
        check(self.lr > 0, f"optim.lr must be > 0, got {self.lr}")
        check(self.base_batch_size >= 1, "optim.base_batch_size must be >= 1")
        one_of("optim.lr_scaling", self.lr_scaling, {"linear", "sqrt", "none"})
        one_of("optim.decay", self.decay, {"cosine", "none"})
        check(self.warmup_steps >= 0, "optim.warmup_steps must be >= 0")
        check(0.0 <= self.min_lr_ratio <= 1.0, "optim.min_lr_ratio must be in [0, 1]")
        check(self.weight_decay >= 0 and self.clip_grad_norm >= 0, "must be >= 0")
        check(self.item_weight_decay in (None, "auto") or (
            not isinstance(self.item_weight_decay, str) and self.item_weight_decay >= 0),
              "optim.item_weight_decay must be >= 0, auto, or null (optim.weight_decay)")
        check(0.0 < self.adam_beta2 < 1.0,
               f"optim.adam_beta2 must be in (0, 1), got {self.adam_beta2}")
        check(0.0 <= self.ema_decay < 1.0,
               f"optim.ema_decay must be in [0, 1), got {self.ema_decay}")


# What a run saved before an optim setting existed trained with, for reading old records back
# (as LEGACY_ARCH does for the model section) once a default differs from it.
LEGACY_OPTIM = {"item_weight_decay": None}


@dataclass
class DistConfig:
    backend: str = "auto"
    """Who averages the gradients: 'horovod' (launch with horovodrun), 'torch' (DDP; launch
    with torchrun) or 'auto': torch under torchrun, else Horovod when installed, else one
    process. Checkpoints and run folders are the same whichever trained."""
    compression: str = "none"
    """Gradient compression on the wire: 'none' or 'fp16'."""
    backward_passes_per_step: int = 1
    """Micro-batches accumulated locally before one allreduce and optimizer step."""
    op: str = "average"
    """How gradients are combined: 'average' or 'adasum' (Adasum needs the MPI controller)."""
    gradient_predivide_factor: float = 1.0
    """Divide gradients by this before the sum and by size/this after (fp16 overflow guard)."""
    fusion_threshold_mb: float | None = None
    """Horovod tensor-fusion buffer (HOROVOD_FUSION_THRESHOLD); None keeps Horovod's 128 MB."""
    cycle_time_ms: float | None = None
    """Horovod background cycle (HOROVOD_CYCLE_TIME); None: 20 ms without CUDA, else Horovod's."""
    threads_per_rank: int | None = None
    """torch threads per rank; None divides the machine's cores evenly between local ranks."""
    sleeping_wait: bool | None = None
    """Sleep, instead of Horovod's spin, while waiting for the gradient allreduce; None: on
    without CUDA, where a spinning rank takes a core the other ranks' compute needs."""
    keep_freed_memory: bool | None = None
    """Let each rank reuse the memory it frees (glibc's malloc without mmap and trimming; see
    hvd_ctsm/train/cpu_memory.py) instead of returning it to the kernel and faulting fresh pages in
    for the next step's large tensors; None: on without CUDA. On ML-100K (2 cores) epochs took
    0.76x the time at np=1 and 0.80x at np=2. Costs resident memory: a rank keeps its peak
    heap until it exits."""
    sparse_gradients: bool | None = None
    """Exchange only the rows of the item and tag tables that a step touched (sparse gradients:
    Horovod allgathers them, DDP's Gloo sums them sparsely), each rank then adding them into
    its dense optimizer state; the sum, and so the step, is the dense exchange's. None: on with
    the shared next-item loss (model.loss=shared, or auto above 25,000 items), where a step
    touches a few thousand of the catalog's rows; the exact softmax's gradient reaches every
    item, so it stays dense there. At 10^6 items a dense exchange moves 256 MB a step."""
    spark_nics: str | None = None
    """Training on Spark with Horovod (horovod.spark): the network interfaces, comma-separated
    (e.g. 'lo' or 'eth0,ib0'), that the Gloo ranks and Horovod's driver and task services use;
    None: the HVD_CTSM_SPARK_NICS environment variable, else every interface the tasks share."""
    spark_slot_wait_s: float = 120.0
    """Training on Spark: seconds to wait for executors with num_proc task slots to register
    before stopping with an error (executors of a new application register after it starts)."""

    def __post_init__(self):
        check(self.spark_slot_wait_s >= 0, "dist.spark_slot_wait_s must be >= 0")
        check(self.spark_nics is None or all(n.strip() for n in self.spark_nics.split(",")),
               "dist.spark_nics must name interfaces, comma-separated (e.g. 'lo' or 'eth0')")
        one_of("dist.backend", self.backend, {"auto", "horovod", "torch"})
        one_of("dist.compression", self.compression, {"none", "fp16"})
        one_of("dist.op", self.op, {"average", "adasum"})
        check(self.backward_passes_per_step >= 1, "dist.backward_passes_per_step must be >= 1")
        check(self.gradient_predivide_factor > 0, "dist.gradient_predivide_factor must be > 0")
        check(self.op == "average" or self.gradient_predivide_factor == 1.0,
               "dist.gradient_predivide_factor only applies to op=average")


@dataclass
class TrackingConfig:
    enabled: bool = True
    """Log the run to MLflow (rank 0 only): params, metrics, tags, artifacts; backtest, gate and
    deploy add to the same run. Off, or without the mlflow package, only TensorBoard and the
    JSON logs are written."""
    uri: str = ""
    """MLflow tracking URI (e.g. http://host:5000, databricks). Empty: the MLFLOW_TRACKING_URI
    environment variable, else a local store beside the run folder that needs no server:
    OUT/../mlflow/mlflow.db (SQLite) with its artifacts in OUT/../mlflow/artifacts."""
    experiment: str = "hvd_ctsm"
    """MLflow experiment the run goes to (on Databricks a workspace path such as
    /Users/me/hvd_ctsm)."""
    registered_model: str = "ctsm"
    """Registered model that deploy adds a version to; its alias `champion` names the model
    deployed last (moved only after a passed gate)."""

    def __post_init__(self):
        check(bool(self.experiment.strip()), "tracking.experiment must not be empty")
        check(bool(self.registered_model.strip()), "tracking.registered_model must not be empty")


@dataclass
class DebugConfig:
    step_delay_s: dict[str, float] = field(default_factory=dict)
    """Fault-injection tests and drills only: seconds a rank sleeps before each batch it reads
    (inside the timed data phase), by rank number or '*' for every rank, e.g.
    debug.step_delay_s='{"1": 2.5}'. Empty: no delay."""

    def __post_init__(self):
        for rank, seconds in self.step_delay_s.items():
            check(rank == "*" or rank.isdigit(),
                   f"debug.step_delay_s: key {rank!r} must be a rank number or '*'")
            check(seconds >= 0, f"debug.step_delay_s[{rank}] must be >= 0, got {seconds}")


@dataclass
class TrainConfig:
    out: str = "runs/train"
    """Run folder: checkpoints/, tensorboard/, config.yaml, metrics.jsonl, model.pt."""
    epochs: int = 100
    """Passes over the training split (at most: see early_stop_evals)."""
    seed: int = 0
    """Seeds parameters (rank 0's are broadcast), sampling and the data order."""
    eval_every_epochs: int = 2
    """Validate (ranking metrics on the validation split) every this many epochs."""
    keep_checkpoints: int = 3
    """Keep the last K checkpoints, plus the best by validation NDCG@10."""
    early_stop_evals: int = 5
    """Stop when validation NDCG@10 (full ranking) has not improved for this many validations
    in a row (0: train all `epochs`), or fewer: see early_stop_rows. Either way the saved model
    (model.pt) is the best one validated, not the last."""
    early_stop_rows: int = 12_000
    """Patience in data as well as in validations: stop after the fewest validations without a
    better NDCG@10 (at least 2, at most early_stop_evals) whose epochs read this many training
    rows, so that the long epochs of a large dataset do not each add minutes of patience. On
    ML-100K and the synthetic set 5 validations are 10-12k rows: 12,000 keeps their 5 (their
    defaults were tuned so); at 9 events a client (8,000 clients) it is 2 validations, which
    kept the same model in every logged run (benchmarks/QUALITY.md). 0: early_stop_evals
    alone."""
    anneal_after_evals: int = 0
    """Once validation NDCG@10 has not improved for this many validations in a row, go back to
    the best validated weights and train on at anneal_lr_factor times the scheduled lr; early
    stopping (early_stop_evals) then counts from there. 0: never. Off: on ML-100K (3
    validations, a tenth of the lr) nothing after the anneal validated better than the best it
    went back to, where the full lr went on to better weights (the record: quality_history)."""
    anneal_lr_factor: float = 0.1
    """The lr multiplier after the anneal (anneal_after_evals)."""
    checkpoint_every_steps: int = 0
    """Also checkpoint every N optimizer steps within an epoch (0: only at epoch ends)."""
    log_every_steps: int = 10
    """TensorBoard scalars every N optimizer steps."""
    amp: str = "auto"
    """Mixed precision on CUDA: 'auto' (bf16 when supported), 'bf16', 'fp16', 'off'. CPU: fp32."""
    progress: bool = True
    """Progress on rank 0: a tqdm bar on a terminal; where stderr is a log or a pipe, a line
    every 30 s (step, share done, steps/s, time left, loss)."""
    max_steps: int = 0
    """Stop after this many optimizer steps in total (0: no limit); for smoke tests."""
    commit_every_steps: int = 10
    """Elastic runs (--elastic): commit the state in memory every N steps; a worker failure
    sends the survivors back to the last commit, so it costs at most N steps of work."""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)

    def __post_init__(self):
        check(self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}")
        check(self.eval_every_epochs >= 1, "eval_every_epochs must be >= 1")
        check(self.keep_checkpoints >= 1, "keep_checkpoints must be >= 1")
        check(self.early_stop_evals >= 0, "early_stop_evals must be >= 0")
        check(self.early_stop_rows >= 0, f"early_stop_rows must be >= 0, got "
              f"{self.early_stop_rows}")
        check(self.anneal_after_evals >= 0, "anneal_after_evals must be >= 0")
        check(0.0 < self.anneal_lr_factor <= 1.0,
               f"anneal_lr_factor must be in (0, 1], got {self.anneal_lr_factor}")
        check(not (self.anneal_after_evals and self.optim.ema_decay),
               "anneal_after_evals needs optim.ema_decay=0 (it returns to the weights, not "
               "their average)")
        check(self.checkpoint_every_steps >= 0 and self.max_steps >= 0, "must be >= 0")
        one_of("amp", self.amp, {"auto", "bf16", "fp16", "off"})
        check(self.commit_every_steps >= 1,
               f"commit_every_steps must be >= 1, got {self.commit_every_steps}")


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(cls, values: dict):
    """Build a (nested) config dataclass, each value converted to its field's declared type."""
    return build(cls, values)


def load_config(path: str | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Defaults <- YAML preset (a path or a preset name) <- overrides."""
    values = read_preset(path) if path else {}
    return from_dict(TrainConfig, apply_overrides(values, overrides or []))


def save_config(cfg: TrainConfig, path: Path) -> None:
    """Whole or not at all: a config.yaml cut short by a full disk was empty, and --resume
    then trained on the defaults while saying it used the run's settings."""
    atomic_write_bytes(Path(path), config_yaml(cfg).encode())


def config_yaml(cfg: TrainConfig) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def train_arg_parser(prog: str = "hvd-ctsm train") -> argparse.ArgumentParser:
    """The trainer's options, shared by every route (horovodrun, elastic, Spark, the CLI)."""
    p = arg_parser(prog, "Train a CTSM on one rank or many (torchrun or horovodrun in front; "
                         "./run.sh train with NP=N). Every setting, its default: --print-config.")
    p.add_argument("overrides", nargs="*", help="section.field=value, e.g. optim.lr=0.002")
    p.add_argument("--config", help=f"YAML file or preset name ({', '.join(preset_names())})")
    p.add_argument("--data", type=location, help="feature job output folder (data.path)")
    p.add_argument("--out", type=location, help="run folder")
    p.add_argument("--epochs", help="passes over the training split (epochs)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its last checkpoint, with its own "
                        "settings (its config.yaml; --config to use others) and the overrides")
    p.add_argument("--init-from", type=location,
                   help="warm-start from a registry, a run folder or a model.pt; the data's "
                        "vocabulary must extend the model's (features --previous-vocab)")
    p.add_argument("--overwrite", action="store_true", help="start afresh in an existing --out")
    p.add_argument("--elastic", action="store_true",
                   help="train under hvd.elastic.run (launch with horovodrun --min-np/--max-np "
                        "--host-discovery-script); see hvd_ctsm/train/elastic.py")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config (YAML) and exit; starts nothing")
    p.add_argument("--check", action="store_true",
                   help="check the config, the dataset and the run folder, then exit 0; starts "
                        "nothing (./run.sh train does this once before its launcher)")
    p.add_argument("--ranks", type=int, metavar="N",
                   help="with --check: the ranks the run will have (each needs training rows)")
    return p


def config_from_argv(argv: list[str], prog: str = "hvd-ctsm train"
                     ) -> tuple[TrainConfig, argparse.Namespace]:
    """argv -> (the resolved TrainConfig, the parsed options). The one place every route turns
    a command line into a config; raises ConfigError (a ValueError) on any bad value."""
    args = train_arg_parser(prog).parse_intermixed_args(list(argv))
    overrides = list(args.overrides)
    for flag, key in ((args.data, "data.path"), (args.out, "out"), (args.epochs, "epochs")):
        if flag is not None:
            overrides.append(f"{key}={flag}")
    cfg = load_config(args.config, overrides)
    if not args.print_config and not cfg.data.path:
        raise ConfigError("--data DIR is required (a folder written by the feature job)")
    return cfg, args


__all__ = ["ConfigError", "DataConfig", "DistConfig", "ModelConfig", "OptimConfig",
           "TrackingConfig", "TrainConfig", "apply_overrides", "as_override", "config_from_argv",
           "config_yaml", "load_config", "preset_names", "read_preset", "save_config", "to_dict"]
