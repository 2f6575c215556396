"""The trainer's program on one rank: argv -> config -> the plain or the elastic loop.

    python -m hvd_ctsm.train --data DIR --out RUN                      # one rank
    horovodrun -np 8 python -m hvd_ctsm.train --data DIR --out RUN     # eight ranks, Horovod
    torchrun --standalone --nproc-per-node 8 -m hvd_ctsm.train ...     # eight ranks, DDP
    hvd-ctsm train --data DIR --out RUN --config ml100k optim.lr=1e-3 --print-config

Every route (horovodrun, elastic, horovod.spark, the CLI) runs `main(argv)`: it picks between
the epoch loop (hvd_ctsm.train.loop) and the elastic one (`python -m hvd_ctsm.train` runs
hvd_ctsm/train/__main__.py, which calls `cli`). `--check` stops after the checks every rank
would make first, so a launcher is never started for a run that cannot begin.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from hvd_ctsm import distributed as dist
from hvd_ctsm.config import ConfigError, config_from_argv, config_yaml
from hvd_ctsm.data.dataset_meta import read_metadata
from hvd_ctsm.train import elastic_loop, faults
from hvd_ctsm.train import loop as train
from hvd_ctsm.train.run_folder import (check_out_folder, check_resume_matches,
                                       check_warm_start_matches)
from hvd_ctsm.train.support import check_launch, note_restart


def main(argv: list[str] | None = None) -> int:
    try:
        cfg, args = config_from_argv(sys.argv[1:] if argv is None else argv)
        check_launch(cfg, args)
    except (ConfigError, dist.BackendError) as exc:  # stops here, before any worker starts
        raise SystemExit(f"error: {exc}") from exc
    if args.print_config:
        print(config_yaml(cfg), end="")
        return 0
    if args.elastic and args.resume:
        raise SystemExit("error: --elastic keeps its state in memory; --resume is for "
                         "restarting a non-elastic run from its checkpoints")
    # torchrun --max-restarts starts every worker again after one failed: they go on from the
    # latest checkpoint, as `--resume` would.
    args.resume = args.resume or dist.restarted_by_launcher()
    # An elastic job starts workers later too (replacements, rejoins): only the first rank 0
    # checks the run folder; the others join whatever run it holds.
    if not args.elastic or dist.launch_rank() == 0:
        check_out_folder(Path(cfg.out), args.resume, args.overwrite, cfg.data.path,
                         remove=not args.check)
        if args.resume:
            check_resume_matches(Path(cfg.out), cfg)
    if args.init_from:
        check_warm_start_matches(args.init_from, cfg)
    if args.check:
        read_metadata(cfg.data.path)  # the dataset: there, complete, of a version we read
        print(f"ok: {cfg.data.path} -> {cfg.out}")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if dist.restarted_by_launcher():
        note_restart(Path(cfg.out))
    watcher = faults.start_stall_watcher(Path(cfg.out))
    try:
        if args.elastic:
            elastic_loop.run(cfg, init_from=args.init_from)
        else:
            train.train(cfg, resume=args.resume, init_from=args.init_from)
        dist.shutdown()
    finally:
        if watcher:
            watcher.close()
    return 0


def cli() -> None:
    from hvd_ctsm.errors import run_cli

    dist.exit_process(run_cli(main, "hvd_ctsm.train"))


if __name__ == "__main__":
    cli()
