"""The trainer's run folder and the model it continues: what --overwrite may remove, what
--resume may continue and what --init-from may warm-start.

Checked in `main`, before any worker starts Horovod and before anything is written in the
folder; the rank that writes it holds it from then to the run's end (hold_run_folder).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from hvd_ctsm.config import TrainConfig, as_override, to_dict
from hvd_ctsm.config.model_config import INIT_ONLY, LEGACY_ARCH, architecture
from hvd_ctsm.config.types import parse_yaml
from hvd_ctsm.data.dataset_meta import read_metadata, read_vocab
from hvd_ctsm.distributed.base import launch_rank
from hvd_ctsm.files import holds, outputs, storage
from hvd_ctsm.model.checkpoint import load_state, model_file


def check_out_folder(out: Path, resume: bool, overwrite: bool, inputs: list,
                     remove: bool = True, hold: bool = True) -> None:
    """A new run never mixes its checkpoints and logs with an earlier run's, and --overwrite
    removes only a run folder we wrote (hvd_ctsm.files.outputs), never an input (the dataset,
    the model it warm-starts from) or a folder holding one. A folder we did not write is refused
    whatever the flags: --resume into it would mark it ours, and a later --overwrite remove its
    files. A folder another run is training in is refused too (hold_run_folder); with `hold`,
    the rank that removes holds it for this run. `remove=False` checks only (--check)."""
    writer = remove and launch_rank() == 0  # every rank checks; one removes and writes
    if launch_rank() == 0 and out.exists():  # first: a folder a run is writing now is said so
        hold_run_folder(out, until_released=writer and hold)
    try:
        outputs.check_replaceable(out, "run", inputs)
    except outputs.UnsafeOutputError as exc:
        raise SystemExit(f"error: {exc}") from exc
    if launch_rank() == 0 and out not in HELD:  # the other ranks' own rank 0 holds it
        hold_run_folder(out, until_released=writer and hold)
    if resume or outputs.is_empty(out):
        return
    if not overwrite:
        raise SystemExit(f"error: {out} already holds a run: pass --resume to continue it "
                         "or --overwrite to start afresh")
    if writer:  # the folder itself stays: it is what this run holds
        outputs.remove_ours(out, keep_folder=True)


UNGUARDED = ("a second `train` into it at the same moment would not be refused; train into "
             "one --out at a time")
HELD: dict[Path, tuple[int, Path | None]] = {}  # run folder -> (its lock, the top folder made)


def hold_run_folder(out: Path, until_released: bool) -> None:
    """Refuse a run folder another `train` is writing now; `until_released`: hold it for this
    run (made if need be; hvd_ctsm.files.holds: the kernel drops the hold when the process
    dies, kill -9 too), else only look. Before, a second `train` into it ran beside the first
    (checkpoints, logs and MLflow link mixed, both exit 0), and --overwrite emptied the folder
    under it. A file system that can lock nothing there goes unguarded, and the run says so."""
    missing = [folder for folder in (out, *out.parents) if not folder.exists()]
    if missing and not until_released:
        return  # nobody trains in a folder that is not there; a check makes nothing
    out.mkdir(parents=True, exist_ok=True)
    try:
        fd = holds.lock_folder(out, UNGUARDED if until_released else "")
    except holds.FolderBusy:
        raise SystemExit(f"error: another `train` is writing {out} now: wait for it to end "
                         "(--resume then goes on from its checkpoints), or train into another "
                         "--out") from None
    if until_released:
        HELD[out] = (fd, missing[-1] if missing else None)
    else:
        os.close(fd)  # only looked: the lock goes with the descriptor


def release_run_folder(out: Path) -> None:
    """Let other runs into `out` (hold_run_folder), at the end of this run. The folders the
    hold made go too where the run wrote nothing in them (it stopped before training: a refused
    --resume into a mistyped --out left its parents); removed before the lock goes, so that a
    run taking the folder next never loses it."""
    fd, made = HELD.pop(Path(out), (None, None))
    if fd is None:
        return
    if made is not None:  # up to the highest folder the hold made; not empty: the run's files
        if outputs.is_empty(out):  # the hold file (NFS) goes with the folder, still held
            (out / outputs.HOLD).unlink(missing_ok=True)
        chain = (out, *out.parents)
        outputs.remove_empty_folders(chain[:chain.index(made) + 1] if made in chain else chain)
    os.close(fd)


def check_run_to_resume(out: str) -> None:
    """The user's --resume continues a run: a folder holding none (absent or empty, most often
    a mistyped --out) is refused; it started a new run there, as if it went on. A folder whose
    run has no checkpoint yet starts from scratch with a warning (nothing to lose)."""
    if storage.is_remote(out) or not outputs.is_empty(Path(out)):
        return
    raise SystemExit(f"error: --resume: {out} holds no run to continue: check --out, or drop "
                     "--resume to start a new run there")


def resumed_settings(cfg: TrainConfig) -> Path | None:
    """The config.yaml a run saved in its folder, which --resume starts from (without it, a
    resume of `train ... epochs=12 early_stop_evals=0` ran on the defaults' 100 epochs and
    early stopping); None for a new folder or a URL."""
    if storage.is_remote(cfg.out):
        return None
    saved = Path(cfg.out) / "config.yaml"
    if saved.is_file() and not saved.read_text().strip():  # would be the defaults, silently
        raise SystemExit(f"error: --resume: {saved} is empty (a write cut short, e.g. by a "
                         "full disk), so the run's settings are unknown: give them as --config "
                         "FILE (`hvd-ctsm train OVERRIDES --print-config > FILE` writes one), "
                         "or remove the empty file to go on with the defaults and the overrides")
    return saved if saved.is_file() else None


def check_resume_matches(out: Path, cfg: TrainConfig) -> None:
    """--resume continues the same model: another model shape would fail deep inside loading."""
    saved = out / "config.yaml"
    if not saved.exists():
        return
    before = (parse_yaml(saved.read_text(), f"config file {saved}") or {}).get("model", {})
    if before:  # a setting the run predates is what it trained with (ModelConfig.from_saved)
        before = LEGACY_ARCH | before
    now = to_dict(cfg)["model"]
    compared = sorted(k for k in now if k in before and k not in INIT_ONLY)
    was, asked = _differing(before, now, compared)
    if was:
        # The difference may come from a default that changed since (the model's on 2026-11-25),
        # not from an override: name the overrides that give the saved values back.
        raise SystemExit(f"error: --resume: {out} holds a run with {was}, this command asks "
                         f"{asked}: pass {was} to resume it, or train into a new --out")


def check_warm_start_matches(path: str, cfg: TrainConfig) -> None:
    """--init-from (the pipeline's --warm-start) copies weights between equal architectures
    only: an earlier model of another one would load into the wrong places (another head
    count, a missing layer left random) without an error. Dropout, loss and loss weights may
    change; --resume's check (above) allows no change at all."""
    state = load_state(model_file(path))  # a registry, a run or version folder, or a model.pt
    check_vocabulary_extends(model_file(path), state, cfg.data.path)
    if "config" not in state:  # a model saved before configs were: only its shapes are known
        return
    saved = architecture(state["config"]["model"])
    trained, asked = _differing(saved, architecture(to_dict(cfg)["model"]), saved)
    if trained:
        raise SystemExit(f"error: --init-from: {path} was trained as {trained}, this run asks "
                         f"for {asked}; add the overrides {trained} to continue that model, or "
                         "leave out --init-from (--warm-start) to train this architecture from "
                         "scratch")


def _differing(before: dict, now: dict, keys) -> tuple[str, str]:
    """The model settings among `keys` that differ, as overrides: (saved values, asked ones);
    two empty strings when none does."""
    differ = [k for k in keys if before[k] != now[k]]
    return (" ".join(_override(k, before[k]) for k in differ),
            " ".join(_override(k, now[k]) for k in differ))


def _override(key: str, value) -> str:
    if key == "outputs":  # the heads trained are the keys of model.head_weights
        return f"model.head_weights with keys {value}"
    return as_override(f"model.{key}", value)


def check_vocabulary_extends(path: Path, state: dict, data: str) -> None:
    """--init-from copies item, category, tag and attribute rows by index: the dataset's
    vocabulary must extend the one the model was trained on (the feature job's
    --previous-vocab), or each row would land on another item without a word."""
    if "vocab_sha256" not in state or state["vocab_sha256"] == read_metadata(data).vocab_sha256:
        return
    found = trained_vocabulary(path, state)
    if found is None:
        raise SystemExit(
            f"error: --init-from: the vocab.json {path} was trained on is neither beside it nor "
            f"in the dataset it was trained on, so {data}'s vocabulary cannot be checked to keep "
            "its indices: put that vocab.json beside the model, or leave out --init-from")
    old_path, old = found
    _, new = read_vocab(data)
    for name, before, now in _indexed(old, new):
        if now[:len(before)] != before:
            at = next((i for i, (a, b) in enumerate(zip(before, now, strict=False))
                       if a != b), len(now))
            was, became = before[at], now[at] if at < len(now) else "nothing"
            raise SystemExit(
                f"error: --init-from: {data}'s vocabulary does not keep the indices {path} was "
                f"trained with ({name} index {at} was {was!r}, is {became!r}): rebuild the "
                f"features with --previous-vocab {old_path}, or leave out --init-from")


def trained_vocabulary(path: Path, state: dict) -> tuple[Path, dict] | None:
    """(path, content) of the vocab.json whose bytes the model was trained on: beside it (a
    registry version) or in its training dataset; None when neither is."""
    data = (state.get("config") or {}).get("data", {}).get("path")
    candidates = [Path(path).parent / "vocab.json"] + ([Path(data) / "vocab.json"] if data and
                                                        not storage.is_remote(data) else [])
    for candidate in candidates:
        if candidate.is_file():
            raw = candidate.read_bytes()
            if hashlib.sha256(raw).hexdigest() == state["vocab_sha256"]:
                return candidate, json.loads(raw)
    return None


def _indexed(old: dict, new: dict):
    """(name, old list, new list) of every vocabulary whose indices a model's tables use."""
    for key in ("items", "categories", "tags"):
        yield key, old.get(key, []), new.get(key, [])
    for name, values in old.get("attrs", {}).items():
        yield f"attribute {name}", values, new.get("attrs", {}).get(name, [])
