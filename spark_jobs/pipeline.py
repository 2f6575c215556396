"""The whole chain in one Spark application: features, training, backtest, gate and deploy.

features -> train (horovod.spark, or TorchDistributor without Horovod) -> backtest -> gate ->
deploy:

    spark-submit --master 'local[2]' spark_jobs/pipeline.py --source SRC --work DIR \
        --registry REGISTRY --gate 'ndcg@10>=0.05' [--num-proc 2] [--warm-start]
    run_pipeline(spark, PipelineConfig(...))      # from a notebook with its own session

Re-runnable: when REGISTRY already has a deployed model, the features extend its vocabulary
(every known id keeps its index) and `--warm-start` starts training from its weights. Exit codes
are every program's (hvd_ctsm.errors.EXIT_CODES): 0 deployed, 1 the gate refused (nothing is
deployed), 2 bad arguments or input (a step refused it: its name and the error are printed),
3 a step crashed. WORK/pipeline.json records each step's outcome and seconds.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hvd_ctsm.data.schema import EVENT_TYPES
from hvd_ctsm.errors import (EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED, arg_parser, ctrl_c_stop,
                             disk_full, exit_code_for, run_cli, stop_said)
from hvd_ctsm.files.storage import check_local, location
from spark_jobs.config import CUTOFFS_HELP, EVENT_TYPE_HELP, SPLIT_HELP

PROG = "hvd-ctsm pipeline"  # the name its one-line errors start with


@dataclass
class PipelineConfig:
    """One pipeline run; validated on construction."""

    source: str
    """Events for the feature job (movielens:DIR, synthetic:k=v,..., events:PATH)."""
    work: str
    """Folder for this run: WORK/features, WORK/model, WORK/backtest.json, WORK/pipeline.json."""
    registry: str
    """Model registry (hvd_ctsm.serving.deploy): read for the previous vocabulary, written on
    success."""
    gate: str = "ndcg@10>=0.05"
    """Deploy gate (hvd_ctsm.evaluation.backtest syntax); below it the pipeline deploys nothing
    and exits 1."""
    num_proc: int = 2
    """Horovod ranks, one Spark task each (the application needs that many task slots)."""
    config: str = "default"
    """Trainer preset or YAML file."""
    train_args: list[str] = field(default_factory=list)
    """Extra trainer arguments, e.g. ['epochs=3', 'model.dim=32']."""
    warm_start: bool = False
    """Start training from the deployed model's weights (when there is one)."""
    split: str = "leave-last-out"
    """Feature job split: `leave-last-out` or `time` (with `cutoffs`)."""
    cutoffs: tuple[str | int, str | int] | str | None = None
    """(T1, T2) or "T1,T2", unix seconds or ISO dates, for `split="time"` (FeatureConfig's)."""
    max_len: int = 200
    """Feature job history length."""
    row_groups: int = 64
    """Feature job row groups per split (at least num_proc)."""
    event_type: str | None = None
    """Every event's type, for a source without an event_type column (FeatureConfig's)."""

    def __post_init__(self):
        check_local(self.work, "--work")  # the steps' own local-only outputs, checked first
        check_local(self.registry, "--registry")
        from hvd_ctsm.serving.deploy import check_registry

        # The registry is the last step's output: a file or a wrong folder there was found only
        # after the features and the training had run.
        work = Path(self.work)
        check_registry(Path(self.registry), (work / "features", work / "model"))
        check_work(work, Path(self.registry))  # a dataset, a folder in one, the user's folder
        if self.num_proc < 1:
            raise ValueError(f"num_proc must be >= 1, got {self.num_proc}")
        if self.row_groups < self.num_proc:
            raise ValueError(f"row_groups {self.row_groups} < num_proc {self.num_proc}: some "
                             "ranks would get no rows")
        from hvd_ctsm.config import load_config
        from hvd_ctsm.evaluation.gate import parse_gate

        if not parse_gate(self.gate):
            raise ValueError("gate must name at least one rule, e.g. 'ndcg@10>=0.05'")
        # The feature job's and the trainer's configs, before Spark starts (a ConfigError is a
        # ValueError).
        self.features(Path(self.work) / "features")
        load_config(self.config, list(self.train_args))

    def features(self, out: Path, previous_vocab: Path | None = None):
        """The feature step's FeatureConfig (validated on construction)."""
        from spark_jobs.config import FeatureConfig

        return FeatureConfig(
            source=self.source, out=str(out), split=self.split, cutoffs=self.cutoffs,
            max_len=self.max_len, row_groups=self.row_groups, event_type=self.event_type,
            overwrite=True,
            previous_vocab=str(previous_vocab) if previous_vocab else None)


# What a run writes in WORK (the tracking store, tracking.link.STORE_FOLDER, included) and the
# temporary siblings of those entries that its atomic writes and stages make.
WORK_ENTRIES = ("features", "model", "backtest.json", "pipeline.json", "mlflow")


def check_work(work: Path, registry: Path | None = None) -> None:
    """--work is new, empty or a pipeline's own work folder: before, a folder of the user's
    files got features/, model/ and the reports written beside them. A work folder from before
    they were marked holds pipeline.json and nothing but what a run writes (and the
    `registry`, where it was put inside): it is taken."""
    from hvd_ctsm.files import outputs

    if work.exists() and not work.is_dir():
        raise ValueError(f"--work {work} is a file, not a folder; pick a folder (a new one, or "
                         "one the pipeline made)")
    outputs.check_not_inside_a_whole(work)
    record = outputs.marker(work)
    if record is not None and record.get("kind") != "pipeline":
        raise outputs.UnsafeOutputError(
            f"refusing to write to {work}: it holds hvd_ctsm {record.get('kind')} output, not a "
            "pipeline's work folder; pick another --work")
    if record is None and not outputs.is_empty(work) and not _earlier_work(work, registry):
        raise outputs.UnsafeOutputError(
            f"refusing to write to {work}: it holds files the pipeline did not write (no "
            f"{outputs.MARKER} in it); pick a new folder for --work, or one the pipeline made")


def _earlier_work(work: Path, registry: Path | None) -> bool:
    """An unmarked work folder that only a pipeline run wrote (see check_work)."""
    inside = registry is not None and registry.resolve().parent == work.resolve()
    entries = (*WORK_ENTRIES, registry.name) if inside else WORK_ENTRIES

    def own(name: str) -> bool:
        return name in entries or any(name.startswith(f".{e}.") for e in entries)

    names = [p.name for p in work.iterdir()]
    return "pipeline.json" in names and all(own(n) for n in names)


class StepFailed(RuntimeError):
    def __init__(self, step: str, error: BaseException):
        # a full disk is its one line (the feature job's was Java's trace, 166 lines)
        said = disk_full(error) or f"{type(error).__name__}: {error}"
        super().__init__(f"step {step!r} failed: {said}")
        self.step = step
        self.exit_code = exit_code_for(error)


class Steps:
    """Runs named steps, recording outcome and seconds in WORK/pipeline.json as it goes."""

    def __init__(self, work: Path, config: PipelineConfig):
        self.path = work / "pipeline.json"
        self.record = {"config": asdict(config), "steps": [], "result": "running"}

    def run(self, name: str, fn, *args, **kwargs):
        print(f"[pipeline] {name}...", flush=True)
        t0 = time.time()
        try:
            value = fn(*args, **kwargs)
        except KeyboardInterrupt as stop:  # Ctrl-C: pipeline.json said "running" for good
            self.interrupted(name, t0, stop)
            raise
        except Exception as exc:
            stop = ctrl_c_stop()  # a Spark job Ctrl-C cancelled: the stop, not "step failed"
            if stop:
                self.interrupted(name, t0, stop)
                raise stop from None
            self.add(name, "failed", t0, str(exc))
            raise StepFailed(name, exc) from exc
        self.add(name, "ok", t0)
        return value

    def interrupted(self, name: str, t0: float, stop: KeyboardInterrupt) -> None:
        self.add(name, stop_said(stop), t0)
        self.finish(stop_said(stop))

    def add(self, name: str, outcome: str, t0: float, detail: str = "") -> None:
        self.record["steps"].append({"step": name, "outcome": outcome, "detail": detail,
                                     "seconds": round(time.time() - t0, 2)})
        self.save()

    def finish(self, result: str) -> None:
        self.record["result"] = result
        self.save()

    def save(self) -> None:
        from hvd_ctsm.files.atomic import atomic_write_bytes

        atomic_write_bytes(self.path, json.dumps(self.record, indent=2).encode())


def _features(spark, cfg: PipelineConfig, out: Path, previous_vocab: Path | None) -> dict:
    from spark_jobs.build_features import build_features

    return build_features(spark, cfg.features(out, previous_vocab))


def _backtest(data: Path, model: Path, report: Path, gate: str) -> bool:
    from hvd_ctsm.evaluation import backtest
    return backtest.main(["--data", str(data), "--model", str(model), "--report", str(report),
                          "--gate", gate]) == 0


@contextmanager
def work_held(work: Path):
    """One pipeline at a time in `work` (made if need be): a hold (hvd_ctsm.files.holds), which
    the kernel drops when the process dies, kill -9 too. Before, a second run (a schedule's
    next, started before the last ended) rebuilt WORK/features under the first's training and
    backtest, and its deploy could publish a model backtested on other features. A file system
    that can lock nothing there goes unguarded, and the run says so once."""
    from hvd_ctsm.files import holds, outputs

    work.mkdir(parents=True, exist_ok=True)
    # Unmarked and not empty, check_work took it as an earlier run's: marked before the hold,
    # so that on NFS its hold file is made (none is in a folder not ours). claim marks only an
    # unmarked folder; an empty one is marked by the run itself (_run_steps).
    if not outputs.is_empty(work):
        outputs.claim(work, "pipeline")
    try:
        fd = holds.lock_folder(work, "a second pipeline into it at the same moment would "
                                 "not be refused; run one pipeline in this --work at a time")
    except holds.FolderBusy:
        raise WorkInUse(f"another pipeline is writing {work} now: wait for it to end, or "
                        "pick another --work") from None
    try:
        yield
    finally:
        os.close(fd)


class WorkInUse(RuntimeError):
    """Another pipeline run holds the work folder."""


def check_work_free(work: Path) -> None:
    """WorkInUse when another pipeline holds `work` now. Nothing is made or kept held: the
    command asks before it starts Spark (a refused run started its application first: a local
    JVM with the driver heap sized for the source, beside the first run's training), and
    run_pipeline then holds it."""
    if work.is_dir():
        with work_held(work):
            pass


def run_pipeline(spark, cfg: PipelineConfig) -> int:
    """Run every step in `spark`'s application; returns the exit code (see the module doc)."""
    try:
        with work_held(Path(cfg.work)):
            return _run_steps(spark, cfg)
    except WorkInUse as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _run_steps(spark, cfg: PipelineConfig) -> int:
    from hvd_ctsm.config import load_config
    from hvd_ctsm.files import outputs
    from hvd_ctsm.serving import deploy
    from hvd_ctsm.train.launch import LaunchOptions
    from hvd_ctsm.train.spark_train import train_on_spark

    work = Path(cfg.work)
    data, model, report = work / "features", work / "model", work / "backtest.json"
    outputs.claim(work, "pipeline")  # a later run may reuse it (check_work)
    deployed = deploy.current(cfg.registry)
    if cfg.warm_start and not deployed:
        print(f"[pipeline] --warm-start: {cfg.registry} has no deployed model yet: training "
              "from scratch")
    steps = Steps(work, cfg)
    try:
        previous = deployed / "vocab.json" if deployed else None
        steps.run("features", _features, spark, cfg, data, previous)
        train_cfg = load_config(cfg.config, [*cfg.train_args, f"data.path={data}", f"out={model}"])
        init_from = str(deployed / "model.pt") if cfg.warm_start and deployed else None
        steps.run("train", train_on_spark, train_cfg, cfg.num_proc, spark,
                  LaunchOptions(overwrite=True, init_from=init_from))
        if not steps.run("backtest", _backtest, data, model, report, cfg.gate):
            steps.finish("gate refused: nothing deployed")
            print(f"{PROG}: the gate {cfg.gate!r} refused the model: nothing deployed "
                  f"(report: {report})", file=sys.stderr)
            return EXIT_REFUSED
        version = steps.run("deploy", deploy.deploy, model, report, cfg.registry)
    except StepFailed as exc:
        steps.finish(str(exc))
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    steps.finish(f"deployed {version}")
    print(f"[pipeline] deployed {version}")
    return EXIT_OK


def parse_args(argv=None):
    p = arg_parser(PROG, __doc__.splitlines()[0])
    p.add_argument("--source", required=True,
                   help="the events (hvd-ctsm features --help): movielens:DIR, "
                        "synthetic:k=v,..., events:PATH, table:NAME or delta:PATH")
    p.add_argument("--work", type=location, required=True, help="folder for this run's outputs")
    p.add_argument("--registry", type=location, required=True, help="model registry folder")
    p.add_argument("--gate", default=PipelineConfig.gate, help="deploy gate (default %(default)s)")
    p.add_argument("--num-proc", type=int, default=2,
                   help="training ranks, one Spark task each (default 2)")
    p.add_argument("--config", default="default", help="trainer preset or YAML")
    p.add_argument("--warm-start", action="store_true", help="start from the deployed model")
    p.add_argument("--split", default="leave-last-out", choices=("time", "leave-last-out"),
                   help=SPLIT_HELP)
    p.add_argument("--cutoffs", help=CUTOFFS_HELP)
    p.add_argument("--max-len", type=int, default=200, help="longest history (default 200)")
    p.add_argument("--row-groups", type=int, default=64,
                   help="least row groups per split (default 64; at least --num-proc)")
    p.add_argument("--event-type", choices=EVENT_TYPES, help=EVENT_TYPE_HELP)
    p.add_argument("--master", help="Spark master (default: spark-submit's, else local[NUM_PROC])")
    p.add_argument("train_args", nargs="*", help="trainer overrides, e.g. epochs=3 model.dim=32")
    return p.parse_intermixed_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        cfg = PipelineConfig(source=args.source, work=args.work, registry=args.registry,
                             gate=args.gate, num_proc=args.num_proc, config=args.config,
                             train_args=args.train_args, warm_start=args.warm_start,
                             split=args.split, max_len=args.max_len, row_groups=args.row_groups,
                             cutoffs=args.cutoffs, event_type=args.event_type)
    except ValueError as exc:
        print(f"{PROG}: bad arguments: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from spark_jobs.driver_heap import sized_spark
    from spark_jobs.session import resolve_master

    # Under spark-submit the master comes from its --master (the JVM is already configured).
    master = resolve_master(args.master, local_default=f"local[{cfg.num_proc}]")
    try:
        check_work_free(Path(cfg.work))
    except WorkInUse as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    spark = sized_spark(cfg.source, master, PROG, app_name="hvd_ctsm-pipeline")
    return run_pipeline(spark, cfg)


if __name__ == "__main__":  # spark-submit spark_jobs/pipeline.py: a crash is one line, exit 3
    sys.exit(run_cli(main, PROG))
