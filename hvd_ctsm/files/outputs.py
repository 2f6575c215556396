"""Output folders we own: a marker file in each, and the rules for replacing one.

Every folder the project writes (feature datasets, training runs, Spark score folders, the model
registry) holds MARKER, a small JSON file naming its kind. `--overwrite` removes a folder only when
it holds our marker of the same kind and does not hold, and is not inside, one of the command's
inputs: a mistyped `--out` must never cost data we did not create. A local output is built whole
in a marked temporary sibling and then swapped into place (`staged`), so readers never see half
of one. Standard library only (the Spark job imports it without torch).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from hvd_ctsm.files import storage
from hvd_ctsm.files.atomic import atomic_write_bytes

MARKER = ".hvd_ctsm-output.json"
# The file a run folder or --work is held by where the folder itself cannot be locked (NFS;
# hvd_ctsm.files.holds): not content, so every check of what a folder holds passes over it.
HOLD = ".hvd_ctsm-hold"
KINDS = ("features", "run", "scores", "predictions", "registry", "pipeline")
STALE_ELSEWHERE_S = 24 * 3600  # a temp folder of another host's job is stale after a day


CURRENT = "current"  # the registry's pointer file: the name of its deployed version's folder


def deployed_version(registry: str | Path) -> Path | None:
    """The folder a registry's `current` names (hvd_ctsm.serving.deploy writes it), or None."""
    pointer = Path(registry) / CURRENT
    return Path(registry) / pointer.read_text().strip() if pointer.is_file() else None


def folder_holding(path: str | Path, kinds: tuple[str, ...]) -> tuple[Path, str] | None:
    """(folder, kind): the nearest folder above `path` that we marked as one of `kinds`. A
    registry from before registries were marked is known by its `current` and versions."""
    if storage.is_remote(path):
        return None
    for folder in Path(path).resolve().parents:
        kind = (marker(folder) or {}).get("kind") or ("registry" if is_old_registry(folder)
                                                      else None)
        if kind:
            return (folder, kind) if kind in kinds else None
    return None


def is_old_registry(folder: Path) -> bool:
    """An unmarked folder deploy made before it marked registries: `current` names one of its
    version folders."""
    try:
        version = deployed_version(folder)
    except (OSError, ValueError):  # an unreadable `current`: not one deploy wrote
        return False
    return version is not None and version.parent == folder and version.name[:1] == "v" \
        and version.is_dir()


# What lies inside each whole output, for the refusal that names it
WHOLES = {"features": "the feature dataset {}, which only the feature job writes",
          "registry": "the model registry {}, whose versions never change after deploy"}


def check_not_inside_a_whole(path: str | Path, kinds: tuple[str, ...] = tuple(WHOLES),
                             fix: str | dict[str, str] = "pick an --out outside it") -> None:
    """Refuse to write `path` inside a feature dataset or a registry: their readers check them
    file by file (a file added to a split made the dataset refused as damaged), and a registry
    version never changes after deploy. `fix` ends the message (one for each kind, or one for
    all): each command names its own option."""
    held = folder_holding(path, kinds)
    if held:
        folder, kind = held
        fix = fix[kind] if isinstance(fix, dict) else fix
        raise UnsafeOutputError(f"refusing to write {path}: it lies inside "
                                f"{WHOLES[kind].format(folder)}; {fix}")


class UnsafeOutputError(FileExistsError):
    """Writing or replacing this output could destroy data we did not create."""


class OutputExistsError(FileExistsError):
    """The output folder exists and overwrite was not asked for."""


def mark(folder: str | Path, kind: str) -> None:
    """Claim `folder` (which must exist) as an output of `kind` written by this process."""
    if kind not in KINDS:
        raise ValueError(f"unknown output kind {kind!r}")
    record = {"kind": kind, "host": socket.gethostname(), "pid": os.getpid(),
              "created": round(time.time(), 3)}
    # Whole or absent: a marker cut short by a full disk read as none, and every later run
    # into the folder was refused as not ours, --resume and --overwrite too.
    atomic_write_bytes(Path(folder) / MARKER, (json.dumps(record) + "\n").encode())


def claim(folder: str | Path, kind: str) -> None:
    """Create `folder` if needed and mark it ours, unless it already holds a marker."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    if marker(folder) is None:
        mark(folder, kind)


def marker(folder: str | Path) -> dict | None:
    """The marker record of `folder`, or None when it has none (or an unreadable one)."""
    try:
        record = json.loads((Path(folder) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _overlaps(out: Path, source: Path) -> bool:
    """True when `out` is `source`, holds it, or lies inside it."""
    return out == source or out in source.parents or source in out.parents


def _url_overlaps(out: str, source: str) -> bool:
    """_overlaps for URLs (s3://bucket/a): at a path boundary, so s3://b/ab is not in s3://b/a."""
    out, source = out.rstrip("/"), source.rstrip("/")
    return out == source or out.startswith(source + "/") or source.startswith(out + "/")


def check_not_an_input(out: str | Path, inputs: Iterable[str | Path | None],
                       option: str = "--out") -> None:
    """Refuse an output that is, holds or lies inside one of the command's inputs (local
    folders, or URLs compared as text); the message names the command's `option` for it."""
    for source in filter(None, inputs):
        if storage.is_remote(out) or storage.is_remote(source):
            overlaps = _url_overlaps(str(out), str(source))
        else:
            overlaps = _overlaps(Path(out).resolve(), Path(source).resolve())
        if overlaps:
            raise UnsafeOutputError(
                f"refusing to write {out}: it is, holds or lies inside the input {source}; "
                f"pick another {option}, outside every input")


def check_new_url(out: str, inputs: Iterable[str | Path | None] = ()) -> None:
    """A URL output is written once: an object store cannot swap a folder atomically, so an
    existing one is never replaced (nor one that overlaps an input)."""
    check_not_an_input(out, inputs)
    if storage.exists(out):
        raise OutputExistsError(
            f"output {out} exists; a URL output is never replaced (--overwrite applies to local "
            "folders): pick a new URL, e.g. a dated prefix")


def check_replaceable(out: str | Path, kind: str, inputs: Iterable[str | Path | None] = ()) -> None:
    """Stop unless `out` may be (re)written: absent or empty, or ours of the same kind, and
    not inside a dataset or a registry."""
    check_not_an_input(out, inputs)
    check_not_inside_a_whole(out)
    out = Path(out)
    for _ in range(3):  # OUT swapped by another job (outputs.publish) meanwhile: look again
        if not out.exists() or (out.is_dir() and is_empty(out)):
            return
        record = marker(out)
        if record is not None:
            break
    if record is None:
        raise UnsafeOutputError(
            f"refusing to write to {out}: it was not written by hvd_ctsm (no {MARKER} in it); "
            "pick another --out, or remove the folder yourself if it is really disposable")
    if record.get("kind") != kind:
        raise UnsafeOutputError(
            f"refusing to write to {out}: it holds hvd_ctsm {record.get('kind')} output, not "
            f"{kind}; pick another --out")


def is_empty(folder: Path) -> bool:
    """Absent or without entries but HOLD (another rank may be removing it right now)."""
    try:
        return all(p.name == HOLD for p in Path(folder).iterdir())
    except FileNotFoundError:
        return True


def remove_empty_folders(folders: Iterable[Path]) -> None:
    """rmdir each folder in turn (a folder, then its parents) and stop at the first that is not
    empty; one already gone (another process was first) is passed over."""
    for folder in folders:
        try:
            Path(folder).rmdir()
        except FileNotFoundError:
            continue
        except OSError:  # not empty (or not ours to remove): nothing above it is empty either
            return


def remove_ours(folder: Path, keep_folder: bool = False) -> None:
    """Remove a folder check_replaceable allowed, its marker last: other ranks checking it
    meanwhile still see it as ours until nothing else is left. `keep_folder`: empty it only
    (a training run holds its lock on the folder itself, or on its HOLD, which stays)."""
    for child in Path(folder).iterdir():
        if child.name not in (MARKER, HOLD):
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    if keep_folder:
        (Path(folder) / MARKER).unlink(missing_ok=True)
    else:
        shutil.rmtree(folder)


def _still_running(record: dict) -> bool:
    """Whether the process that wrote `record` may still be working (this host only)."""
    if record.get("host") != socket.gethostname():  # cannot ask another host: trust a day
        return time.time() - float(record.get("created", 0)) < STALE_ELSEWHERE_S
    try:
        os.kill(int(record.get("pid", -1)), 0)
    except (OSError, ValueError):
        return False
    return True


def remove_stale_temps(out: str | Path) -> list[Path]:
    """Remove `.OUT.tmp-*` / `.OUT.old-*` siblings left by killed jobs for the same OUT.

    Only folders holding our marker whose writer is no longer running are removed: a concurrent
    job's stage and anything we did not create stay."""
    out = Path(out)
    removed = []
    for pattern in (f".{out.name}.tmp-*", f".{out.name}.old-*"):
        for stale in sorted(out.parent.glob(pattern)):
            record = marker(stale)
            if stale.is_dir() and record is not None and not _still_running(record):
                shutil.rmtree(stale, ignore_errors=True)
                removed.append(stale)
    return removed


def check_output(out: Path, overwrite: bool, kind: str, inputs=()) -> None:
    """Stop unless `out` may be written: it overlaps no input, and an existing `out` is replaced
    only when it is ours (check_replaceable: else refused, so the message never suggests
    --overwrite for it) and only with `overwrite`. Creates nothing."""
    check_replaceable(out, kind, inputs)
    if out.exists() and not overwrite:
        raise OutputExistsError(f"output {out} exists; pass --overwrite to replace it")


def staging_dir(out: Path, overwrite: bool, kind: str = "features", inputs=()) -> Path:
    """A fresh temporary sibling of `out` to build the whole output in (checked before work:
    check_output). Temp folders of killed runs for the same `out` go first."""
    check_output(out, overwrite, kind, inputs)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out)
    stage = out.with_name(f".{out.name}.tmp-{uuid.uuid4().hex[:8]}")
    stage.mkdir()
    try:
        mark(stage, kind)
    except BaseException:  # unmarked, remove_stale_temps would never take it away
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return stage


def publish(stage: Path, out: Path, overwrite: bool = True) -> None:
    """Move the finished output into place; an old output is removed only after the swap. A
    Ctrl-C or a SIGTERM meanwhile waits for the swap: between its two renames OUT is nowhere.

    Another job may have published the same OUT since this one was checked (overlapping runs of
    a scheduled command): without `overwrite` its output stays and this one is refused (before,
    it was replaced all the same); with it, the last swap wins. Either way, one job's output
    landing between the other's two renames made that rename fail (crashed, "Directory not
    empty"), and one moving OUT aside just before the other did made that one fail ("OUT not
    found"): the swap is now tried again."""
    with stops_deferred():
        for _ in range(SWAP_TRIES):
            if out.exists() and not overwrite:
                raise OutputExistsError(
                    f"output {out} was written by another job while this one ran; it is kept "
                    "and this job's output dropped: pass --overwrite to replace it, or pick "
                    "another --out")
            old = _move_aside(out) if overwrite else None  # else: what landed is refused
            try:
                os.replace(stage, out)
            except OSError as exc:  # another error keeps the old output aside, as it was
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
            else:
                _remove_old(old)
                return
            _remove_old(old)  # OUT, which another job filled meanwhile, is replaced next try
        raise OutputExistsError(f"output {out} kept being replaced by other jobs while this one "
                                "tried to publish; run one job for an --out at a time")


SWAP_TRIES = 10  # another job publishing the same OUT between our renames: try again


def _move_aside(out: Path) -> Path | None:
    """Rename `out` to a temporary sibling for removal; None when there is none (any more)."""
    old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
    try:
        os.replace(out, old)
    except FileNotFoundError:  # absent, or another job moved it aside meanwhile
        return None
    return old


def _remove_old(old: Path | None) -> None:
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def stops_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM within the block are held until it ends (in the main thread; elsewhere
    a block runs as it is, as no signal reaches it). Then SIGINT is raised as KeyboardInterrupt,
    and SIGTERM does what it would have done: its handler's stop (spark_session's Terminated),
    or, where it had none, the end of the process. Before, a SIGTERM between the swap's two
    renames left OUT nowhere, and the next run removed both folders as a killed run's temps."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: came.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if signal.SIGTERM in came:
        term = previous[signal.SIGTERM]
        if term is signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGTERM)  # as it would have: the process ends here
        elif callable(term):
            term(signal.SIGTERM, None)
    if signal.SIGINT in came and previous[signal.SIGINT] is not signal.SIG_IGN:
        raise KeyboardInterrupt


def discard(stage: Path) -> None:
    """Remove an unfinished stage (the job failed or was stopped): OUT is left as it was."""
    shutil.rmtree(stage, ignore_errors=True)


@contextmanager
def staged(out: str | Path, overwrite: bool, kind: str, inputs=()) -> Iterator[Path]:
    """Build an output in a stage (`staging_dir`, checked before any work), then publish it.

    The body writes into the yielded folder; on a normal exit it replaces `out` (publish), and
    on any exception (a failure, Ctrl-C, a refused publish) the stage is discarded and `out` is
    left as it was."""
    stage = staging_dir(Path(out), overwrite, kind, inputs)
    try:
        yield stage
        publish(stage, Path(out), overwrite)
    except BaseException:
        discard(stage)  # gone already when published
        raise
