"""Train inside a Spark application: the trainer's own entry point, run by horovod.spark or by
Spark's TorchDistributor.

    from hvd_ctsm.config import load_config
    from hvd_ctsm.train.spark_train import train_on_spark
    cfg = load_config("ml100k", [f"data.path={DIR}", f"out={RUN}", "epochs=5"])
    summary = train_on_spark(cfg, num_proc=2, options=LaunchOptions(overwrite=True))

Each of the `num_proc` Spark tasks starts one rank that runs `hvd_ctsm.train.launch.run(cfg,
options)` (the config travels typed, pickled with the task), what
`horovodrun -np N python -m hvd_ctsm.train ARGV` (or torchrun) runs: the same sharded Petastorm
reading, the same gradient averaging, rank 0 alone writing the run folder. The config's
dist.backend picks the route: horovod -> horovod.spark.run (Gloo); torch -> TorchDistributor
(torchrun workers, DDP); auto -> Horovod when installed, else torch. The run folder and the
dataset must be on a filesystem that every executor and the driver see (local mode, or a shared
mount such as /dbfs on Databricks).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hvd_ctsm.config import ConfigError, TrainConfig
from hvd_ctsm.data.batches import read_metadata, shard_rows, split_url
from hvd_ctsm.files import holds
from hvd_ctsm.train import faults
from hvd_ctsm.train.launch import LaunchOptions, check_run_folder, parse_command


class SparkTrainingError(RuntimeError):
    """Training on Spark did not produce a model; the message says why."""


def _train_rank(cfg: TrainConfig, options: LaunchOptions, env: dict[str, str]) -> dict:
    """Runs in every rank (a process started by a Spark task, or torchrun under one), as the
    command line's trainer does: a failure is one line on the executor's stderr and an exit
    code, returned with that line for the driver to say. Before, the rank's traceback went up
    through Spark, and the driver said Horovod's "Exit code: 1" or Java's trace (83 lines),
    neither naming the cause (a full disk)."""
    os.environ.update(env)
    from hvd_ctsm import distributed, errors
    from hvd_ctsm.train import launch
    errors.SAID.clear()
    code = errors.run_cli(lambda _argv: launch.run(cfg, options), faults.PROG, [],
                          crash_traceback=True)
    said = errors.SAID[-1].removeprefix(f"{faults.PROG}: ").removeprefix("error: ") \
        if code and errors.SAID else None
    # The interface Gloo used (horovod.spark sets it from the nics it was given or found).
    result = {"rank": distributed.launch_rank(), "exit_code": code, "said": said,
              "gloo_iface": os.environ.get("HOROVOD_GLOO_IFACE")}
    if code and distributed.launched_by_torchrun():  # TorchDistributor returns one result
        from hvd_ctsm.distributed import torch_spark
        if said and faults.followed_another(said):
            result["before"] = torch_spark.failures_before(
                result["rank"], int(os.environ["WORLD_SIZE"]))
        else:
            torch_spark.leave_failure(result)
    return result


def failed_ranks_line(failed: list[dict]) -> str:
    """The driver's line for ranks that failed: the line of the one that failed first (not of
    one that stopped with it), with its rank; every rank's line (and a crash's traceback above
    it) is in its executor's stderr."""
    first = min(failed, key=lambda r: (faults.followed_another(r["said"] or ""), r["rank"]))
    said = first["said"] or f"exit code {first['exit_code']}"
    return f"training on Spark failed on rank {first['rank']}: {said}"


def spark_backend(choice: str) -> str:
    """The route for dist.backend=`choice` on Spark (no launcher to tell: auto prefers
    Horovod when it is installed, as the trainer alone does)."""
    from hvd_ctsm import distributed
    if choice == "auto":
        return "horovod" if distributed.horovod_importable() else "torch"
    return choice


def typed_config(cfg: TrainConfig | list[str], options: LaunchOptions | None
                 ) -> tuple[TrainConfig, LaunchOptions]:
    """(config, options); a command line (how this function was called before it took a typed
    config) is parsed as the CLI parses it. A bad value stops here, before any task starts."""
    if not isinstance(cfg, (list, tuple)):
        return cfg, options or LaunchOptions()
    try:  # as the command line: --resume without --config takes the run's own settings
        parsed, args, _ = parse_command(list(cfg))
    except ConfigError as exc:
        raise SparkTrainingError(str(exc)) from exc
    return parsed, options or LaunchOptions(resume=args.resume, overwrite=args.overwrite,
                                            init_from=args.init_from)


def check_dataset(data: str, num_proc: int) -> None:
    """Stop on the driver, not in a rank, when the dataset cannot be sharded over num_proc."""
    read_metadata(data)
    rows = shard_rows(split_url(data, "train"), num_proc)
    if min(rows) == 0:
        raise SparkTrainingError(f"{data}: a shard of {num_proc} has no training rows: rebuild "
                                 "the features with more row groups or use fewer ranks")


NICS_ENV = "HVD_CTSM_SPARK_NICS"  # the default of dist.spark_nics


def spark_nics(setting: str | None) -> list[str] | None:
    """The interfaces for horovod.spark: dist.spark_nics, else $HVD_CTSM_SPARK_NICS, else None
    (Horovod picks every interface the tasks share)."""
    text = setting or os.environ.get(NICS_ENV, "")
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        return None
    import psutil

    # Horovod's driver service binds on these too: a name this host lacks would only show up as
    # a start timeout minutes later.
    present = sorted(psutil.net_if_addrs())
    missing = [n for n in names if n not in present]
    if missing:
        raise SparkTrainingError(f"network interface(s) {', '.join(missing)} (dist.spark_nics or "
                                 f"${NICS_ENV}) not on this host, which has {', '.join(present)}: "
                                 "name interfaces that the driver and every executor have")
    return names


def task_slots(spark) -> int:
    """Task slots of the executors registered now: the scheduler's own count (what a barrier
    stage checks). Not defaultParallelism: on a cluster it is at least 2 before any executor
    has registered, and it follows spark.default.parallelism when that is set."""
    context = spark.sparkContext
    try:
        jvm_context = context._jsc.sc()
        profile = jvm_context.resourceProfileManager().defaultResourceProfile()
        return int(jvm_context.maxNumConcurrentTasks(profile))
    except Exception:  # noqa: BLE001  internals of another Spark version: the public estimate
        return context.defaultParallelism


def wait_for_task_slots(spark, num_proc: int, timeout_s: float, poll_s: float = 1.0) -> None:
    """Return once the application has num_proc task slots; SparkTrainingError (one line)
    when it still has fewer after timeout_s (Horovod needs every rank running at once)."""
    deadline = time.monotonic() + timeout_s
    slots = task_slots(spark)
    while slots < num_proc and time.monotonic() < deadline:
        time.sleep(poll_s)
        slots = task_slots(spark)
    if slots < num_proc:
        raise SparkTrainingError(
            f"the Spark application has {slots} task slots after waiting {timeout_s:g} s for "
            f"executors to register, fewer than num_proc={num_proc}: every rank needs its own "
            "task (all run at once); lower num_proc, add executor cores or workers, or wait "
            "longer (dist.spark_slot_wait_s)")


def rank_environment(threads: int) -> dict[str, str]:
    """What each rank's process sets before it trains: a Spark task does not inherit the
    driver's environment."""
    env = {"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1", faults.STARTED_BY: "spark"}
    if holds.SAID_UNGUARDED in os.environ:  # the pipeline warned of its folders already
        env[holds.SAID_UNGUARDED] = os.environ[holds.SAID_UNGUARDED]
    return env


def train_on_spark(cfg: TrainConfig | list[str], num_proc: int = 2, spark=None,
                   options: LaunchOptions | None = None, threads_per_rank: int | None = None,
                   start_timeout: int | None = None, local_mode: bool = False,
                   use_gpu: bool = False) -> dict:
    """Run the trainer on `num_proc` Spark tasks; return the run's train_summary.json.

    cfg: the typed config (hvd_ctsm.config.load_config); options: --resume, --overwrite,
    --init-from as LaunchOptions.
    spark: an existing SparkSession (a notebook's); by default the active one, else a local one.
    threads_per_rank: OMP/torch threads in each rank (default: cores / num_proc on this host).
    local_mode, use_gpu: TorchDistributor's (dist.backend=torch): all ranks on the driver's host
    instead of the executors; one GPU per rank.
    """
    if num_proc < 1:
        raise SparkTrainingError(f"num_proc must be >= 1, got {num_proc}")
    cfg, options = typed_config(cfg, options)
    check_dataset(cfg.data.path, num_proc)
    try:  # on the driver: a refused run folder was a failed rank's line in a Spark trace
        check_run_folder(cfg, options, options.resume, remove=False)
    except SystemExit as exc:
        raise SparkTrainingError(str(exc).removeprefix("error: ")) from None
    if spark is None:
        from hvd_ctsm.spark_session import get_spark

        spark = get_spark(master=f"local[{num_proc}]", app_name="hvd_ctsm-train")
    backend = spark_backend(cfg.dist.backend)
    if not (backend == "torch" and local_mode):  # local_mode: the ranks run on the driver
        # A local master has its slots from the start; executors of a cluster register later.
        local = spark.sparkContext.master.startswith("local")
        wait_for_task_slots(spark, num_proc, 0 if local else cfg.dist.spark_slot_wait_s)
    nics = spark_nics(cfg.dist.spark_nics) if backend == "horovod" else None
    env = rank_environment(threads_per_rank or max(1, (os.cpu_count() or 1) // num_proc))
    from hvd_ctsm import distributed
    try:
        if backend == "torch":  # TorchDistributor returns one rank's result: rank 0's task's, or
            # in local_mode the last torchrun worker's to write it (they share one file)
            results = [distributed.torch_spark_run(_train_rank, (cfg, options, env), num_proc,
                                                   local_mode=local_mode, use_gpu=use_gpu)]
        else:
            results = distributed.spark_run(_train_rank, args=(cfg, options, env),
                                            num_proc=num_proc, start_timeout=start_timeout,
                                            nics=nics)
    except Exception as exc:  # both report a failed rank as a bare RuntimeError
        raise SparkTrainingError(f"training on Spark failed: {exc}") from exc
    failed = [r for r in results if r["exit_code"] != 0]
    failed += [before for r in failed for before in r.pop("before", [])]
    if failed:
        raise SparkTrainingError(failed_ranks_line(failed))
    summary_path = Path(cfg.out) / "train_summary.json"
    if not summary_path.exists():
        raise SparkTrainingError(f"training on Spark ended without {summary_path} "
                                 f"(rank results: {results})")
    summary = json.loads(summary_path.read_text())
    summary["spark_ranks"] = results  # each rank's exit code and Gloo interface (Horovod)
    return summary
