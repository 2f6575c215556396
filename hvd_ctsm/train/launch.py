"""The trainer's program on one rank: argv -> config -> the plain or the elastic loop.

    python -m hvd_ctsm.train --data DIR --out RUN                      # one rank
    horovodrun -np 8 python -m hvd_ctsm.train --data DIR --out RUN     # eight ranks, Horovod
    torchrun --standalone --nproc-per-node 8 -m hvd_ctsm.train ...     # eight ranks, DDP
    hvd-ctsm train --data DIR --out RUN --config ml100k optim.lr=1e-3 --print-config

Every route ends in `run(cfg, options)`, with a typed config (`main(argv)` is the command line's
way there, and the only place argv is parsed): it picks between
the epoch loop (hvd_ctsm.train.loop) and the elastic one (`python -m hvd_ctsm.train` runs
hvd_ctsm/train/__main__.py, which calls `cli`). `--check` stops after the checks every rank
would make first, so a launcher is never started for a run that cannot begin.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from hvd_ctsm import distributed as dist
from hvd_ctsm.config import ConfigError, TrainConfig, config_from_argv, config_yaml
from hvd_ctsm.data.batches import shard_rows, split_url
from hvd_ctsm.data.dataset_meta import read_metadata
from hvd_ctsm.errors import AGAIN, DISK_FULL, NoSpaceError, stop_said
from hvd_ctsm.files import outputs, storage
from hvd_ctsm.train import elastic_loop, faults
from hvd_ctsm.train import loop as train
from hvd_ctsm.train.run_folder import (check_out_folder, check_resume_matches, check_run_to_resume,
                                       check_warm_start_matches, release_run_folder,
                                       resumed_settings)
from hvd_ctsm.train.support import check_launch, note_restart


@dataclass(frozen=True)
class LaunchOptions:
    """What a run does besides its config: the command line's flags, typed."""

    resume: bool = False  # continue from the run folder's latest checkpoint
    overwrite: bool = False  # start afresh in a run folder we wrote
    init_from: str | None = None  # warm-start from this model.pt
    elastic: bool = False  # Elastic Horovod (hvd.elastic.run)
    check: bool = False  # make the checks a rank makes first, then stop
    ranks: int | None = None  # with check: the world size the run will have


def main(argv: list[str] | None = None) -> int:
    """The command line (the only place it is parsed) -> run(cfg, options)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        cfg, args, saved = parse_command(argv)
        if saved and dist.launch_rank() == 0 and not args.check:  # once: run.sh checks first
            print(f"--resume: the settings of {saved}, with this command's overrides",
                  file=sys.stderr)
    except ConfigError as exc:  # stops here, before any worker starts
        raise SystemExit(f"error: {exc}") from exc
    if args.print_config:
        print(config_yaml(cfg), end="")
        return 0
    return run(cfg, LaunchOptions(resume=args.resume, overwrite=args.overwrite,
                                  init_from=args.init_from, elastic=args.elastic,
                                  check=args.check, ranks=args.ranks))


def parse_command(argv: list[str]) -> tuple[TrainConfig, argparse.Namespace, Path | None]:
    """(config, flags, the config.yaml it resumes from): --resume without --config continues
    the run as it was set up, with argv's overrides on top."""
    cfg, args = config_from_argv(argv)
    saved = resumed_settings(cfg) if args.resume and not args.config else None
    if saved:
        cfg, args = config_from_argv([*argv, "--config", str(saved)])
    return cfg, args, saved


def check_run_folder(cfg: TrainConfig, options: LaunchOptions, resume: bool,
                     remove: bool = True) -> None:
    """The run folder may take this run, the run it resumes is the same model and a warm start
    the same architecture (SystemExit naming the fix otherwise); with `remove`, --overwrite
    empties the folder. Made by the first rank, and by a Spark driver before its tasks start."""
    storage.check_local(cfg.out, "--out (out)")  # a run folder is local (renames, markers)
    if options.init_from:
        storage.check_local(options.init_from, "--init-from")
        # before --overwrite may empty the folder: the model may be in it
        check_warm_start_matches(options.init_from, cfg)
    if not options.elastic or dist.launch_rank() == 0:
        inputs = [cfg.data.path, options.init_from]  # --overwrite removed a warm start's model
        check_out_folder(Path(cfg.out), resume, options.overwrite, inputs, remove=remove,
                         hold=not options.elastic)  # elastic workers come and go
        # Workers torchrun restarts resume too, in a run that may not have checkpointed yet.
        if options.resume and not dist.restarted_by_launcher():
            check_run_to_resume(cfg.out)
        if resume:
            check_resume_matches(Path(cfg.out), cfg)


def run(cfg: TrainConfig, options: LaunchOptions | None = None) -> int:
    """Train on this rank with a typed config (every route ends here: horovodrun, torchrun,
    elastic, horovod.spark, TorchDistributor, the CLI, the notebook API)."""
    options = options or LaunchOptions()
    try:
        check_launch(cfg, options)
    except (ConfigError, dist.BackendError) as exc:  # stops here, before any worker starts
        raise SystemExit(f"error: {exc}") from exc
    if options.elastic and options.resume:
        raise SystemExit("error: --elastic keeps its state in memory; --resume is for "
                         "restarting a non-elastic run from its checkpoints")
    # torchrun --max-restarts starts every worker again after one failed: they go on from the
    # latest checkpoint, as `--resume` would.
    resume = options.resume or dist.restarted_by_launcher()
    try:  # the run folder is held from its check on (run_folder.hold_run_folder)
        return checked_run(cfg, options, resume)
    finally:
        release_run_folder(Path(cfg.out))


def checked_run(cfg: TrainConfig, options: LaunchOptions, resume: bool) -> int:
    """run's checks of the run folder, then the training (or, with --check, nothing more)."""
    # An elastic job starts workers later too (replacements, rejoins): only the first rank 0
    # checks the run folder; the others join whatever run it holds.
    check_run_folder(cfg, options, resume, remove=not options.check)
    if options.check:
        read_metadata(cfg.data.path)  # the dataset: there, complete, of a version we read
        if options.ranks:  # every rank gets training rows (else each rank says so, after start)
            shard_rows(split_url(cfg.data.path, "train"), options.ranks)
        print(f"ok: {cfg.data.path} -> {cfg.out}")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if dist.restarted_by_launcher():
        note_restart(Path(cfg.out))
    watcher = faults.start_stall_watcher(Path(cfg.out))
    try:
        if options.elastic:
            elastic_loop.run(cfg, init_from=options.init_from)
        else:
            train.train(cfg, resume=resume, init_from=options.init_from)
        dist.shutdown()
    except KeyboardInterrupt as stop:  # Ctrl-C: one line, with the way on (errors.run_cli)
        if options.elastic:
            raise
        raise type(stop)(f"{stop_said(stop)}; the same command with --resume goes on from the last "
                         f"checkpoint in {cfg.out}") from None
    except OSError as exc:  # a full disk: its line (hvd_ctsm.errors.run_cli), with the way on
        if exc.errno not in DISK_FULL or options.elastic:
            raise
        # TensorBoard's and the logs' writes name no file: the run folder is where they go
        raise NoSpaceError.of(exc, cfg.out, way_on_after_a_failure(Path(cfg.out))) from exc
    finally:
        if watcher:
            watcher.close()
    return 0


def way_on_after_a_failure(out: Path) -> str:
    """--resume goes on in a folder the run wrote to (without it, the command is refused
    there); in one it left empty, --resume is refused and the same command starts again."""
    if outputs.is_empty(out):
        return AGAIN
    return f"the same command with --resume goes on from the last checkpoint in {out}"


def cli() -> None:
    from hvd_ctsm.errors import run_cli

    dist.exit_process(run_cli(main, faults.PROG))


if __name__ == "__main__":
    cli()
