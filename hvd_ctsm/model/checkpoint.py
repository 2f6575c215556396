"""Checkpoints that survive a crash mid-write and cannot run code when loaded.

A checkpoint is one dict (model, optimizer, scheduler, step, epoch, data position, config,
vocabulary hash) saved as `step-000000123.pt` with a `.sha256` beside it. Writes go to a temporary
file that is fsynced and renamed into place, so a reader sees either the old set or the new one.
Loading verifies the checksum and uses `torch.load(weights_only=True)`; a damaged latest checkpoint
falls back to the previous good one with a warning (the damaged one is kept as NAME.damaged), and
a folder of damaged ones only is refused.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import shutil
from pathlib import Path

# torch is imported where a state is saved or loaded: gate and deploy use this module to find and
# check model files, and start in a fraction of a second without it.
from hvd_ctsm.files.atomic import atomic_write_bytes, fsync_dir
from hvd_ctsm.files.outputs import deployed_version

log = logging.getLogger(__name__)
NAME = re.compile(r"^step-(\d{9})\.pt$")


class CheckpointError(RuntimeError, ValueError):
    """A model or checkpoint file that does not load: bad input (exit 2: another file, or
    `--model` naming something else), not a crash."""


def model_file(path: str | Path) -> Path:
    """Where a model is, however it is named: a registry (its `current` version, the pointer
    hvd_ctsm.serving.deploy writes), a run or version folder, or a model.pt itself."""
    path = deployed_version(path) or Path(path)
    return path / "model.pt" if path.is_dir() else path


def load_model(path: str | Path):
    """The one model loader: (the CTSM in eval mode, its saved state) from any of model_file's
    names. Every consumer (backtest, scoring, the pyfunc flavour, Spark executors) loads here."""
    from hvd_ctsm.model.ctsm import CTSM

    path = model_file(path)
    state = load_state(path)
    if not {"sizes", "config", "model"} <= state.keys():  # it said "missing field 'sizes'"
        raise CheckpointError(f"{path} is not a model.pt (no model sizes and settings in it): a "
                              "training checkpoint (checkpoints/*.pt)? pass the run folder, or "
                              "its model.pt")
    return CTSM.from_checkpoint(state), state


def save_state(path: Path, state: dict) -> str:
    """Save `state` with torch.save, atomically, plus a checksum file; returns the sha256."""
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    # The pair goes into place one rename at a time. Dropping a replaced file's checksum first
    # means a crash in between leaves a whole file without one (loaded unverified: renames are
    # atomic), never a checksum of the file it replaced beside the new one.
    Path(f"{path}.sha256").unlink(missing_ok=True)
    atomic_write_bytes(Path(path), data)
    atomic_write_bytes(Path(f"{path}.sha256"), f"{digest}  {Path(path).name}\n".encode())
    return digest


def recorded_sha256(path: Path) -> str | None:
    """The sha256 save_state recorded beside `path` (its checksum file), None without one; an
    empty checksum file is "" (no file's digest)."""
    sidecar = Path(f"{path}.sha256")
    return (sidecar.read_text().split() or [""])[0] if sidecar.is_file() else None


def model_sha256(path: Path) -> str:
    """A model file's sha256 as its checksum file holds it (loading the model checks the bytes
    against it), else from its bytes: a catalog of 10^6 items is a file of hundreds of MB."""
    recorded = recorded_sha256(path)
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if recorded is None else recorded


def verify_checksum(path: Path, data: bytes, required: bool = False) -> None:
    """`data`, the bytes of `path`, match the checksum file save_state wrote beside it
    (CheckpointError otherwise); a missing checksum file is refused only when `required`."""
    want = recorded_sha256(path)
    if want is None:
        if required:
            raise CheckpointError(f"{path}.sha256 not found: the checksum file hvd-ctsm train "
                                  f"writes beside {path.name}, to check it is whole")
        return
    if hashlib.sha256(data).hexdigest() != want:
        raise CheckpointError(f"{path}: checksum mismatch (truncated or corrupted)")


def load_state(path: Path) -> dict:
    """Load a checkpoint after checking its checksum; weights_only: no code can run."""
    path = Path(path)
    data = path.read_bytes()
    verify_checksum(path, data)
    import torch

    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001  any unpickling failure means a bad file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: cannot be loaded: not a model or checkpoint this "
                              f"package saved, or a damaged one ({first[:160]})") from exc


class CheckpointManager:
    """Rank 0's checkpoint folder: the last `keep` step checkpoints plus best.pt."""

    def __init__(self, folder: Path, keep: int):
        self.folder = Path(folder)
        self.keep = keep

    def steps(self) -> list[int]:
        if not self.folder.exists():
            return []
        return sorted(int(m.group(1)) for p in self.folder.iterdir() if (m := NAME.match(p.name)))

    def path_for(self, step: int) -> Path:
        return self.folder / f"step-{step:09d}.pt"

    def remove_partial_writes(self) -> list[Path]:
        """Temporary files of writes that a killed process never finished (never loaded)."""
        partial = sorted(self.folder.glob(".*.tmp")) if self.folder.exists() else []
        for tmp in partial:
            tmp.unlink(missing_ok=True)
            log.warning("removed %s: a checkpoint write interrupted by a crash", tmp.name)
        return partial

    def save(self, state: dict, step: int, is_best: bool = False) -> Path:
        self.remove_partial_writes()  # only rank 0 writes here, so none is in progress
        path = self.path_for(step)
        save_state(path, state)
        if is_best:
            self._copy_atomic(path, self.folder / "best.pt")
        # A run's steps only go up, but a resume under a larger effective batch numbers them
        # anew from its epoch (fewer steps an epoch): the checkpoints numbered above this one
        # are older, set aside once this one is written.
        for later in [s for s in self.steps() if s > step]:
            self.set_aside(self.path_for(later), "before-resume")
        for old in self.steps()[:-self.keep]:
            self.path_for(old).unlink(missing_ok=True)
            Path(f"{self.path_for(old)}.sha256").unlink(missing_ok=True)
        return path

    def set_aside(self, path: Path, why: str = "damaged") -> None:
        """Rename a step checkpoint (and its checksum) to NAME.<why>, kept but no longer one of
        the run's steps: a damaged one, or one numbered before a resume renumbered the steps
        (save). Left under its name, it counted among the `keep` newest by its step number:
        the resumed run's own checkpoints (lower numbers) were pruned in its favour, with keep=1
        each as it was written, a save at its step replaced it without a word, and a later
        --resume went back to it."""
        aside = path.with_name(f"{path.name}.{why}")
        for n in range(1, 1000):  # never over one set aside before
            if not aside.exists():
                break
            aside = path.with_name(f"{path.name}.{why}-{n}")
        try:
            os.replace(path, aside)
            if Path(f"{path}.sha256").exists():
                os.replace(f"{path}.sha256", f"{aside}.sha256")
        except OSError as exc:  # a read-only folder: the resume goes on, as it did before
            log.warning("could not set %s aside (%s): it stays, counted as a step", path, exc)
            return
        log.warning("kept %s checkpoint %s as %s (no longer one of the run's checkpoints)",
                    why, path.name, aside.name)

    def _copy_atomic(self, src: Path, dst: Path) -> None:
        tmp = dst.with_name(f".{dst.name}.tmp")
        try:
            shutil.copyfile(src, tmp)
            shutil.copyfile(f"{src}.sha256", f"{tmp}.sha256")
        except OSError as exc:  # a full disk: the part copied held the space a resume needs
            tmp.unlink(missing_ok=True)
            Path(f"{tmp}.sha256").unlink(missing_ok=True)
            raise OSError(exc.errno, exc.strerror, str(dst)) from exc  # not our temporary name
        Path(f"{dst}.sha256").unlink(missing_ok=True)  # as in save_state: never a stale checksum
        os.replace(tmp, dst)
        os.replace(f"{tmp}.sha256", f"{dst}.sha256")
        fsync_dir(dst.parent)

    def load_latest(self) -> dict | None:
        """The newest checkpoint that loads, best.pt (a copy of an earlier step's) last; each
        damaged one is skipped with a warning. Once one loads, the damaged ones (all newer)
        are renamed aside (set_aside), kept for a look. None when the folder holds no
        checkpoint; when every one is damaged, a CheckpointError and every file stays as it
        is: a resume that silently started over would throw the run's training away."""
        candidates = [self.path_for(step) for step in reversed(self.steps())]
        candidates += [best] if (best := self.folder / "best.pt").exists() else []
        damaged = []
        for path in candidates:
            try:
                state = load_state(path)
            except (CheckpointError, OSError) as exc:
                log.warning("skipping %s checkpoint %s: %s",
                            "damaged" if isinstance(exc, CheckpointError) else "unreadable", path,
                            str(exc).removeprefix(f"{path}: "))
                if isinstance(exc, CheckpointError):  # an I/O error may pass (NFS, FUSE)
                    damaged.append(path)
                continue
            for bad in damaged:
                self.set_aside(bad)
            return state
        if candidates:
            raise CheckpointError(
                f"no checkpoint in {self.folder} loads ({', '.join(p.name for p in candidates)}: "
                "each damaged, see the warnings): put back good copies to resume, or start "
                "afresh with --overwrite instead of --resume (it removes them)")
        return None

