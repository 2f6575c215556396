"""One command for every step: `hvd-ctsm STEP [options]` (the wheel's console script).

    hvd-ctsm features --source synthetic:clients=1200 --out runs/features
    horovodrun -np 2 hvd-ctsm train --data runs/features --out runs/model --config default
    hvd-ctsm train --config ml100k optim.lr=1e-3 --print-config
    hvd-ctsm backtest --data runs/features --model runs/model --report runs/backtest.json

Each step is its module's own `main(argv)`, imported only when that step runs (a `hvd-ctsm
gate` loads no torch). `hvd-ctsm STEP --help` shows the step's options.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

# step -> (module whose main(argv) runs it, one line of help)
STEPS = {
    "features": ("spark_jobs.build_features", "the Spark feature job: events -> Petastorm dataset"),
    "train": ("hvd_ctsm.train.launch",
              "train on this rank (under torchrun or horovodrun for several)"),
    "backtest": ("hvd_ctsm.evaluation.backtest",
                 "offline evaluation against popularity, with a gate"),
    "gate": ("hvd_ctsm.evaluation.gate",
             "apply a deploy gate to a backtest report (exit 1 refuses)"),
    "deploy": ("hvd_ctsm.serving.deploy", "copy a gated model into the registry"),
    "score": ("hvd_ctsm.serving.score", "top-K unseen items per client, Parquet"),
    "pipeline": ("spark_jobs.pipeline", "features -> train on Spark -> backtest -> gate -> deploy"),
    "doctor": ("hvd_ctsm.doctor", "check the installed stack, one line per check"),
}
# Not part of the package: run from a checkout's root, as its own program.
BENCH = ("benchmarks/run_all.py", "every benchmark, then benchmarks/RESULTS.md (in a checkout)")


def usage() -> str:
    width = max(map(len, STEPS))
    lines = [f"  {name:<{width}}  {text}" for name, (_, text) in {**STEPS, "bench": BENCH}.items()]
    return "usage: hvd-ctsm STEP [options]   (hvd-ctsm STEP --help for a step's options; " \
        "--version)\n\n" \
        + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if not argv:  # no step: a script that lost its argument should not pass
        print(f"hvd-ctsm: name a step\n\n{usage()}", file=sys.stderr)
        return 2
    if argv[0] in ("-V", "--version"):
        print(f"hvd-ctsm {version()}")
        return 0
    step, rest = argv[0], argv[1:]
    if step == "bench":
        return bench(rest)
    if step not in STEPS:
        print(f"hvd-ctsm: unknown step {step!r}; one of: {', '.join([*STEPS, 'bench'])}\n\n"
              f"{usage()}", file=sys.stderr)
        return 2
    return importlib.import_module(STEPS[step][0]).main(rest) or 0


def version() -> str:
    """The installed distribution's version (the checkout's setup.cfg when not installed)."""
    from importlib import metadata

    try:
        return metadata.version("hvd_ctsm")
    except metadata.PackageNotFoundError:
        import configparser

        setup = configparser.ConfigParser()
        setup.read(Path(__file__).resolve().parents[1] / "setup.cfg")
        return setup.get("metadata", "version", fallback="unknown")


def bench(argv: list[str]) -> int:
    """The benchmarks need a checkout (their results live in it): run them from its root."""
    script = Path(BENCH[0])
    if not script.is_file():
        print(f"hvd-ctsm bench: no {script} here: run it from the root of a checkout (the "
              "benchmarks are not part of the wheel)", file=sys.stderr)
        return 2
    import runpy

    # Its main, here: its usage line then names the command typed (`python run_all.py` said
    # run_all.py).
    run_all = runpy.run_path(str(script), run_name="hvd_ctsm_bench")
    return run_all["main"](argv, "hvd-ctsm bench")


def cli() -> None:
    """The console script: bad input is one line and exit 2, a crash one line and exit 3
    (`--debug` shows the traceback), as each step's own program does."""
    from hvd_ctsm.errors import run_cli

    step = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] in STEPS else None
    code = run_cli(main, f"hvd-ctsm {step}" if step else "hvd-ctsm")  # the step's own name
    dist = sys.modules.get("hvd_ctsm.distributed")  # imported by the steps that train only
    if dist is not None:
        dist.exit_process(code)
    sys.exit(code)


if __name__ == "__main__":
    cli()
