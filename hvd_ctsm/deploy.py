"""Deploy a model that passed its gate into a versioned registry folder, atomically.

    python -m hvd_ctsm.deploy --model RUN --report RUN/backtest.json --registry REGISTRY

REGISTRY/v0001/ holds model.pt, config.yaml, metadata.json, vocab.json and backtest.json;
REGISTRY/current names the deployed version. A version folder appears whole or not at all (it is
built under a temporary name and renamed), and `current` is replaced atomically. A report whose
gate did not pass, or that was made for another model file, is refused (exit code 1).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from hvd_ctsm.atomic import atomic_write_bytes
from hvd_ctsm.backtest import model_file


class DeployRefused(RuntimeError):
    pass


def check_report(report: dict, model: Path) -> None:
    gate = report.get("gate", {})
    if gate.get("passed") is not True:
        reason = "no gate was applied" if gate.get("passed") is None else "the gate failed"
        raise DeployRefused(f"refusing to deploy: {reason} "
                            f"({[c['rule'] for c in gate.get('checks', []) if not c['passed']]})")
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    if report.get("model_sha256") != digest:
        raise DeployRefused("refusing to deploy: the report was made for another model file")


def next_version(registry: Path) -> str:
    taken = [int(p.name[1:]) for p in registry.glob("v[0-9]*") if p.name[1:].isdigit()]
    return f"v{max(taken, default=0) + 1:04d}"


def deploy(model_path: str | Path, report_path: str | Path, registry: str | Path) -> Path:
    model = model_file(model_path)
    report = json.loads(Path(report_path).read_text())
    check_report(report, model)
    registry = Path(registry)
    registry.mkdir(parents=True, exist_ok=True)
    data = Path(report["data"])
    files = {"model.pt": model, "model.pt.sha256": Path(f"{model}.sha256"),
             "config.yaml": model.parent / "config.yaml", "metadata.json": data / "metadata.json",
             "vocab.json": data / "vocab.json", "backtest.json": Path(report_path)}
    staging = Path(tempfile.mkdtemp(dir=registry, prefix=".staging-"))
    try:
        for name, src in files.items():
            if src.exists():
                shutil.copyfile(src, staging / name)
        version = next_version(registry)
        os.replace(staging, registry / version)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    atomic_write_bytes(registry / "current", f"{version}\n".encode())
    return registry / version


def current(registry: str | Path) -> Path | None:
    """The deployed version's folder, or None."""
    pointer = Path(registry) / "current"
    return Path(registry) / pointer.read_text().strip() if pointer.exists() else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hvd_ctsm.deploy", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="run folder or model.pt")
    p.add_argument("--report", required=True, help="the backtest report with a passed gate")
    p.add_argument("--registry", required=True, help="model registry folder")
    args = p.parse_args(argv)
    try:
        path = deploy(args.model, args.report, args.registry)
    except DeployRefused as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"deployed {path} (current -> {path.name})")
    return 0


def cli() -> None:
    sys.exit(main())


if __name__ == "__main__":
    cli()
