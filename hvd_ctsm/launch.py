"""The trainer's program on one rank: argv -> config -> the plain or the elastic loop.

    python -m hvd_ctsm.train --data DIR --out RUN                      # one rank
    horovodrun -np 8 python -m hvd_ctsm.train --data DIR --out RUN     # eight ranks
    hvd-ctsm train --data DIR --out RUN --config ml100k optim.lr=1e-3 --print-config

Every route (horovodrun, elastic, horovod.spark, the CLI) runs `main(argv)`; it lives apart from
hvd_ctsm.train because it picks between train.train and elastic_loop.run, and the elastic loop is
built from train's parts: train.py cannot import it back without a cycle.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from hvd_ctsm import distributed as dist
from hvd_ctsm import elastic_loop, faults, train
from hvd_ctsm.config import ConfigError, config_from_argv, config_yaml
from hvd_ctsm.run_folder import check_out_folder, check_resume_matches


def main(argv: list[str] | None = None) -> int:
    try:
        cfg, args = config_from_argv(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:  # stops here, before any worker starts Horovod
        raise SystemExit(f"error: {exc}") from exc
    if args.print_config:
        print(config_yaml(cfg), end="")
        return 0
    if args.elastic and args.resume:
        raise SystemExit("error: --elastic keeps its state in memory; --resume is for "
                         "restarting a non-elastic run from its checkpoints")
    # An elastic job starts workers later too (replacements, rejoins): only the first rank 0
    # checks the run folder; the others join whatever run it holds.
    if not args.elastic or os.environ.get("HOROVOD_RANK", "0") == "0":
        check_out_folder(Path(cfg.out), args.resume, args.overwrite, cfg.data.path)
        if args.resume:
            check_resume_matches(Path(cfg.out), cfg)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
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

    sys.exit(run_cli(main, "hvd_ctsm.train"))


if __name__ == "__main__":
    cli()
