"""Deploy a model that passed its gate into a versioned registry folder, atomically.

    python -m hvd_ctsm.serving.deploy --model RUN --report RUN/backtest.json --registry REGISTRY

REGISTRY/v0001/ holds model.pt, config.yaml, metadata.json, vocab.json and backtest.json;
REGISTRY/current names the deployed version; deploying what it holds again (the same model and
report, byte for byte) makes no new version. A version folder appears whole or not at all (it is
built under a temporary name and renamed), and `current` is replaced atomically (a version it
could not be moved to, e.g. on a full disk, is removed again). A report whose
gate did not pass, or that was made for another model file, is refused (exit code 1), and so is
a version that would miss a file (exit code 1): metadata.json and vocab.json come from the
report's dataset (a relative path is also tried from the report's folder). A model.pt that does
not match its model.pt.sha256 (or has none), a --report that is not a backtest report and a
--registry that is a file, an input or another kind of output are bad input (exit code 2). The
copy is checked against its sources before `current` moves. Deploys into one registry take
turns (REGISTRY/.deploy.lock): each version gets its own number and `current` names the last one
published. Exit codes: hvd_ctsm/errors.py.

When the model's run was tracked in MLflow (RUN/mlflow_run.json, hvd_ctsm.tracking), the version
is also registered there as a version of the registered model tracking.registered_model (pyfunc
flavour, the version folder as its artifact), and its alias `champion` moves to it. The folder
registry stays the offline fallback: scoring and --warm-start read it, with or without MLflow.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from hvd_ctsm import tracking
from hvd_ctsm.errors import DISK_FULL, arg_parser
from hvd_ctsm.evaluation.gate import read_report
from hvd_ctsm.files import outputs
from hvd_ctsm.files.atomic import FOLDER_MODE, TEMPORARY, atomic_write_bytes, is_temporary, set_mode
from hvd_ctsm.files.holds import not_this_users_to_lock
from hvd_ctsm.files.storage import check_local, location
from hvd_ctsm.model.checkpoint import CheckpointError, model_file, model_sha256, verify_checksum


class DeployRefused(RuntimeError):
    pass


def check_report(report: dict, model: Path) -> None:
    gate = report.get("gate", {})
    if gate.get("passed") is not True:
        failed = ", ".join(c["rule"] for c in gate.get("checks", []) if not c["passed"])
        reason = "no gate was applied" if gate.get("passed") is None else f"its gate failed " \
            f"({failed})"
        raise DeployRefused(f"refusing to deploy: {reason} in the report; the report keeps the "
                            "last gate applied to it: apply the one you mean with `hvd-ctsm "
                            "gate --report REPORT --gate RULES` (or the backtest's --gate)")
    if report.get("split", "test") != "test":  # the split the model was chosen on
        raise DeployRefused(f"refusing to deploy: the report's gate was passed on the "
                            f"{report['split']} split, which picked the model's epoch; gate a "
                            "backtest of the test split (hvd-ctsm backtest, its default)")
    if report.get("model_sha256") != model_sha256(model):  # whole_model checked the bytes
        raise DeployRefused("refusing to deploy: the report was made for another model file")


def newest_number(registry: Path) -> int:
    """The highest version number taken in `registry` (0 for none)."""
    taken = [int(p.name[1:]) for p in registry.glob("v[0-9]*") if p.name[1:].isdigit()]
    return max(taken, default=0)


def next_version(registry: Path) -> str:
    return f"v{newest_number(registry) + 1:04d}"


REQUIRED = ("model.pt", "model.pt.sha256", "config.yaml", "metadata.json", "vocab.json",
            "backtest.json")  # a later --warm-start and scoring need every one


def report_data_dir(report: dict, report_path: Path) -> Path:
    """The report's dataset folder; a relative path is tried from the current folder, then from
    the report's folder (a report moved with its run, or read from another working folder)."""
    data = Path(report.get("data", ""))
    if data.is_absolute() or (data / "metadata.json").exists():
        return data
    return report_path.parent / data


def version_files(model: Path, report: dict, report_path: Path) -> dict[str, Path]:
    """Every file a version holds, checked to exist before anything is written."""
    data = report_data_dir(report, report_path)
    files = {"model.pt": model, "model.pt.sha256": Path(f"{model}.sha256"),
             "config.yaml": model.parent / "config.yaml", "metadata.json": data / "metadata.json",
             "vocab.json": data / "vocab.json", "backtest.json": report_path}
    missing = [f"{name} ({src})" for name, src in files.items() if not src.is_file()]
    if missing:
        raise DeployRefused(f"refusing to deploy an incomplete version: missing "
                            f"{', '.join(missing)}; the report's `data` must name the feature "
                            "folder the model was trained on, beside its run's config.yaml")
    return files


def verify_version(version: Path, files: dict[str, Path]) -> None:
    """The published copy equals its sources, byte for byte."""
    if not holds(version, files):
        raise RuntimeError(f"deploy: {version} differs from its sources after publishing; "
                           "`current` was not moved to it")


def holds(version: Path, files: dict[str, Path]) -> bool:
    """Whether `version` holds a copy of each of `files`, byte for byte."""
    for name, src in files.items():
        copy = version / name
        if not copy.is_file() or copy.stat().st_size != src.stat().st_size or \
                hashlib.sha256(copy.read_bytes()).digest() != \
                hashlib.sha256(src.read_bytes()).digest():
            return False
    return True


def whole_model(model_path: str | Path) -> Path:
    """The model.pt to deploy, checked against the checksum file beside it (bad input, exit 2:
    a truncated or bit-flipped file was refused as "made for another model file", exit 1)."""
    model = model_file(model_path)
    if not model.is_file():
        raise FileNotFoundError(2, "no model.pt here: pass a run folder or a model.pt", str(model))
    try:
        verify_checksum(model, model.read_bytes(), required=True)
    except CheckpointError as exc:
        raise CheckpointError(f"{exc}; deploy a whole model: copy the model again with its "
                              f"{model.name}.sha256, or train again") from None
    return model


def check_registry(registry: Path, inputs) -> None:
    """--registry names a folder deploy may add versions to: not a file, no input, no other
    kind of hvd_ctsm output, not inside a registry (whose versions never change after deploy).
    mkdir said "[Errno 17] File exists" for a file."""
    if registry.exists() and not registry.is_dir():
        raise ValueError(f"--registry {registry} is a file, not a registry folder; pick a folder "
                         "(a new one, or one deploy made)")
    outputs.check_not_an_input(registry, inputs, "--registry")
    outputs.check_not_inside_a_whole(registry, fix={"registry": "pass the registry itself",
                                                    "features": "pick another --registry"})
    record = outputs.marker(registry)
    kind = (record or {}).get("kind", "registry")
    if kind != "registry":
        raise outputs.UnsafeOutputError(f"refusing to deploy into {registry}: it holds hvd_ctsm "
                                        f"{kind} output, not a registry; pick another --registry")
    # A folder of the user's files was marked a registry and got v0001 beside them. (A registry
    # from before registries were marked holds versions: it is taken.)
    if record is None and not holds_only_ours(registry) and not any(registry.glob("v[0-9]*")):
        raise outputs.UnsafeOutputError(f"refusing to deploy into {registry}: it holds files "
                                        "deploy did not write; pick a new folder for the "
                                        "registry, or one deploy made")


LOCK = ".deploy.lock"  # flocked by the deploy that is numbering, publishing and pointing `current`
# flock's errors where the file system keeps no locks: an NFS mount without its lock manager
# (ENOLCK), a FUSE or network file system that has no lock call.
NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL}


def open_lock_file(registry: Path) -> tuple[int, bool]:
    """The registry's lock file, and whether it is open for writing: read-write where this user
    may (an NFS client takes an exclusive flock only on a file open for writing), else read-only
    (a team's shared registry: the file the first deployer made, in that user's umask; a local
    flock needs no more)."""
    try:
        return os.open(registry / LOCK, os.O_RDWR | os.O_CREAT, 0o666), True
    except PermissionError:
        return os.open(registry / LOCK, os.O_RDONLY | os.O_CREAT, 0o666), False


def holds_only_ours(registry: Path) -> bool:
    """Nothing but what deploy makes before a version: its lock, and its marker (which another
    deploy may be writing right now, so that it reads as no marker, and its temporary file
    is there)."""
    try:
        return all(p.name in (outputs.MARKER, LOCK) or is_temporary(p, outputs.MARKER)
                   for p in registry.iterdir())
    except FileNotFoundError:
        return True


@contextmanager
def registry_lock(registry: Path):
    """One deploy at a time in `registry`. Two at once both took the same next vNNNN (the second
    crashed on the rename) or wrote `current` in the order they finished, so that it could name
    the older version. The kernel drops a flock when its holder dies (kill -9 too): a killed
    deploy never leaves the registry locked. Where no lock can be taken, the deploy goes on
    unguarded and says so (before: it crashed, exit 3, and published nothing)."""
    lock, writable = open_lock_file(registry)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another deploy into {registry} to finish", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno == errno.EBADF and not writable:  # flock(2): NFS's exclusive locks
                why = f"this file system {not_this_users_to_lock(registry / LOCK)}"
                then = "make that file writable for every deployer"
            elif exc.errno in NO_LOCKS:
                why = f"{registry} is on a file system without locks ({exc.strerror})"
                then = "deploy there one at a time"
            else:
                raise
            print(f"warning: {why}: this deploy is not kept from another one into the registry "
                  f"at the same moment; {then}", file=sys.stderr)
        yield
    finally:
        os.close(lock)  # releases the lock


def remove_unfinished(registry: Path) -> None:
    """Stages and `current` temporaries of deploys killed before they finished: under the lock
    no other deploy is writing, so any found belong to a dead one (each a partial model copy)."""
    for leftover in [*registry.glob(".staging-*"),
                     *registry.glob(TEMPORARY.format(outputs.CURRENT))]:
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def deploy(model_path: str | Path, report_path: str | Path, registry: str | Path) -> Path:
    """The version `registry`'s `current` names after deploying (see deploy_version)."""
    return deploy_version(model_path, report_path, registry)[0]


def deploy_version(model_path: str | Path, report_path: str | Path,
                   registry: str | Path) -> tuple[Path, bool]:
    """(the deployed version, whether this call published it): a model and report that
    `current` holds already, checked under the lock, make no new version."""
    model = whole_model(model_path)
    report_path = Path(report_path)
    report = read_report(report_path)
    check_report(report, model)
    files = version_files(model, report, report_path)
    registry = Path(registry)
    check_registry(registry, (model.parent, report_data_dir(report, report_path)))
    deployed = current(registry) if registry.is_dir() else None
    if deployed is not None and holds(deployed, files):  # deployed again: nothing new (a
        return deployed, False  # registry the user may only read says so, as before the lock)
    registry.mkdir(parents=True, exist_ok=True)
    with registry_lock(registry):
        deployed = current(registry)
        if deployed is not None and holds(deployed, files):  # another deploy of it, meanwhile
            return deployed, False
        if outputs.marker(registry) is None and not any(registry.glob("v[0-9]*")):
            outputs.mark(registry, "registry")
        remove_unfinished(registry)
        version = unnamed_copy(registry, files)
        if version is not None:  # a deploy of this model killed before it moved `current`
            point_current_at(registry, version.name, files, made_here=False)
        else:
            version = publish_version(registry, files)
        register_in_mlflow(model.parent, version, report)  # champion moves in `current`'s order
    return version, True


def unnamed_copy(registry: Path, files: dict[str, Path]) -> Path | None:
    """The newest version, when `current` names an older one (or none) and it holds `files`
    byte for byte: what a deploy of them killed between publishing it and moving `current`
    leaves. Before, the next deploy of the same model made one more copy beside it, and the
    unnamed one stayed for good."""
    number = newest_number(registry)
    if not number:
        return None
    newest = registry / f"v{number:04d}"
    if current(registry) == newest or not newest.is_dir():
        return None
    return newest if holds(newest, files) else None


def publish_version(registry: Path, files: dict[str, Path]) -> Path:
    """Copy `files` into the registry's next version, check it, and point `current` at it."""
    version = registry / next_version(registry)  # under the lock: no other deploy takes it
    staging = Path(tempfile.mkdtemp(dir=registry, prefix=".staging-"))
    try:
        set_mode(staging, FOLDER_MODE)  # the version: as mkdir makes it, not mkdtemp's 0o700
        for name, src in files.items():
            try:
                shutil.copyfile(src, staging / name)
            except OSError as exc:  # a full disk: named as the version's file, not the stage's
                if exc.errno not in DISK_FULL:
                    raise
                raise OSError(exc.errno, exc.strerror, str(version / name)) from exc
        os.replace(staging, version)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    point_current_at(registry, version.name, files)
    return version


def point_current_at(registry: Path, version: str, files: dict[str, Path],
                     made_here: bool = True) -> None:
    """Check the new version, then move `current` to it. A version `current` never named is
    removed again where this deploy made it: left there, one that a full disk kept `current`
    from naming was never seen as deployed, and the next deploy made a copy of it beside it.
    One an earlier deploy left (unnamed_copy) stays: this deploy did not make it."""
    try:
        verify_version(registry / version, files)
        atomic_write_bytes(registry / outputs.CURRENT, f"{version}\n".encode())
    except BaseException:
        if made_here and current(registry) != registry / version:  # (failed after the rename)
            shutil.rmtree(registry / version, ignore_errors=True)
        raise


def register_in_mlflow(run_folder: Path, version: Path, report: dict) -> None:
    """The MLflow registry beside the folder one (hvd_ctsm.tracking), when the model's run was
    tracked: a model version with the pyfunc flavour, `champion` moved to it (the gate passed:
    check_report refused anything else). The folder version is deployed either way: a store
    that fails here costs the MLflow version only, said in one line."""
    try:
        registered = tracking.register(run_folder, version, report)
    except Exception as exc:  # noqa: BLE001  the folder registry already holds the version
        print(f"hvd-ctsm deploy: warning: {version} is deployed, "
              f"but MLflow did not register it "
              f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]}); fix the store and "
              "deploy again, or load it from the folder registry", file=sys.stderr)
        return
    if registered is not None:
        name, number = registered
        print(f"registered models:/{name}/{number} in MLflow; models:/{name}@{tracking.CHAMPION} "
              "names it")


def current(registry: str | Path) -> Path | None:
    """The deployed version's folder, or None."""
    return outputs.deployed_version(registry)


def main(argv: list[str] | None = None) -> int:
    p = arg_parser("hvd-ctsm deploy", __doc__.splitlines()[0])
    p.add_argument("--model", type=location, required=True, help="run folder or model.pt")
    p.add_argument("--report", type=location, required=True,
                   help="the backtest report, whose last gate (the backtest's or hvd-ctsm "
                        "gate's) passed")
    p.add_argument("--registry", type=location, required=True,
                   help="model registry folder (a new vNNNN in it, `current` moved to it; none "
                        "when `current` holds this model and report already); a "
                        "tracked run's model is also registered in MLflow as "
                        "tracking.registered_model, alias champion")
    args = p.parse_args(argv)
    for option in ("model", "report", "registry"):  # each is read or written as a local path
        check_local(getattr(args, option), f"--{option}")
    try:
        path, published = deploy_version(args.model, args.report, args.registry)
    except DeployRefused as exc:
        print(exc, file=sys.stderr)
        return 1
    if published:
        print(f"deployed {path} (current -> {path.name})")
    else:
        print(f"already deployed: {path} holds this model and report (current -> {path.name}); "
              "no new version")
    return 0


def cli() -> None:
    from hvd_ctsm.errors import run_cli

    sys.exit(run_cli(main, "hvd-ctsm deploy"))


if __name__ == "__main__":
    cli()
