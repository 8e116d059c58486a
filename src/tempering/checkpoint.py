"""Checkpoints that hold a run's whole state, written so a crash can never leave a bad one.

A checkpoint is a directory ``<run>/checkpoints/step-NNNNNNNN/`` holding

- ``model/``: the policy as ``save_pretrained`` writes it, with the tokenizer, so
  ``AutoModelForCausalLM.from_pretrained`` loads it directly (a policy with LoRA adapters:
  merged, or its adapters alone, as ``model.lora.save`` says);
- ``trainer.pt``: everything else, one ``torch.save`` of plain containers and tensors —
  optimizer and LR schedule, the learner's version and KL coefficient, critic and reference
  weights when they exist, scheduler statistics and task cursors, reward normalizer and
  monitor statistics, the RNG states of every worker, rollouts buffered but not yet
  trained on, and the loop's counters;
- ``meta.json``: step, time and the manifest (each file's size and sha256), written last.

Writing is atomic: everything goes into a hidden ``.tmp-step-…`` directory, each file is
fsynced, the directory is renamed into place and its parent fsynced. A directory whose
name is not exactly ``step-NNNNNNNN``, or that lacks ``meta.json``, is never a candidate
for resume, so a checkpoint interrupted at any instant is ignored and cleaned up later.
Older checkpoints beyond ``keep`` are renamed away before they are deleted, for the same
reason. A write that fails (a full disk) removes its temporary directory and leaves the
older checkpoints as they were.

What the rename cannot rule out (a disk that lost or damaged a file later) the manifest
catches: resume takes the newest checkpoint whose files match it and says which it skipped
and why. Checkpoints of the earlier format list sizes only; for them the sizes, the CRCs
``trainer.pt`` (a zip archive) carries and the safetensors headers are checked.

The run folder itself is locked (``flock`` on ``.lock``) by the one process writing into
it; the kernel drops the lock when that process ends, however it ends. ``temper train`` and
``temper sft`` share one lifecycle of it (:func:`open_run`, :class:`RunFolder`): lock, resume
point, the resolved ``config.yaml`` of a run that starts, the step logs cut back to the step
the run continues from, ``summary.json`` and the lock let go at the end.

Not done here: sharded (multi-rank) checkpoints and remote storage.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import sys
import time
import weakref
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Optional, TypeVar

import numpy as np
import torch

from tempering import faults
from tempering.config import ConfigError, TrainConfig, save_resolved
from tempering.models.loading import load_weights_from
from tempering.models.lora import is_adapted, saved_form
from tempering.reporting.metrics import truncate_metrics

STEP_DIR = re.compile(r"^step-(\d{8})$")


LOCK_NAME = ".lock"
RUN_FILES = ("config.yaml", "metrics.jsonl")
"""Files only a run writes: a folder holding one is a run, continued with ``--resume``."""
FINAL_MODEL = "checkpoint-final"
"""The folder in a run that holds the policy (and tokenizer) at the end of the run."""


class StorageError(RuntimeError):
    """A run folder or checkpoint could not be written (a full disk); the message names the path."""


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _disk_full(path: Path, exc: BaseException) -> bool:
    """Whether a failed write ran out of space. Not every writer says so: torch.save reports
    a short write as a bare position mismatch, so for an error without an errno the free space
    is looked at too (an error with one says what it is: a missing folder under /proc, where
    nothing is ever free, is not a full disk)."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if "No space left on device" in str(exc):
        return True
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    return shutil.disk_usage(existing).free < 1 << 20


@contextmanager
def writing(path: Path, cleanup: Optional[Path] = None) -> Iterator[None]:
    """Turn a failed write under ``path`` into a :class:`StorageError` naming it, removing the
    half-written ``cleanup`` directory first. Other errors (bugs, interrupts) pass unchanged."""
    try:
        yield
    except Exception as exc:
        full = not isinstance(exc, StorageError) and _disk_full(path, exc)
        if not (full or isinstance(exc, (OSError, StorageError))):
            raise
        if cleanup is not None:
            shutil.rmtree(cleanup, ignore_errors=True)
        if isinstance(exc, StorageError):
            raise
        reason, fix = ("no space left on device (the disk is full)", "Free space") if full else (_cause(exc), "Fix that")
        raise StorageError(f"cannot write {path}: {reason}; nothing written before it was lost. "
                           f"{fix}, then continue with `temper train --resume RUN_DIR`") from None


def _cause(exc: BaseException) -> str:
    """What went wrong, in words: ``permission denied (/runs/x)``."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:] + (f" ({exc.filename})" if exc.filename else "")
    return str(exc)


def check_run_dir(run_dir: Optional[str], resume: bool) -> None:
    """Refuse a new run in a folder that holds anything: a run (continue it with ``--resume``) or
    other files, which a run's config.yaml, metrics.jsonl and summary.json could overwrite."""
    if resume or not run_dir:
        return
    path = Path(run_dir)
    if not path.exists():
        _check_can_make(path)
        return
    if not path.is_dir():
        raise ConfigError(f"run_dir={run_dir} is a file, not a folder; choose a new or empty folder")
    names = sorted(p.name for p in path.iterdir() if p.name != LOCK_NAME)
    if any(name in RUN_FILES for name in names):
        raise ConfigError(f"run_dir={run_dir} already holds a run; continue it with "
                          f"`temper train --resume {run_dir}` or choose another folder")
    if names:
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise ConfigError(f"run_dir={run_dir} is not empty and not a run folder (it holds {shown}); "
                          "choose a new or empty folder for the run")


def _check_can_make(path: Path) -> None:
    """Refuse a new run folder whose nearest existing parent is a file or not writable, before
    the model is loaded; what only ``mkdir`` can find out (a missing folder under /proc) is
    reported by :func:`open_run_dir`."""
    parent = next(p for p in path.absolute().parents if p.exists())
    if not parent.is_dir():
        raise ConfigError(f"run_dir={path}: {parent} is a file, not a folder; choose another folder for the run")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"run_dir={path}: cannot make a folder in {parent} (permission denied); "
                          "choose a folder you can write")


class RunLock:
    """An exclusive ``flock`` on ``<run>/.lock`` while this process writes into the run.

    The lock belongs to the open file, so the kernel releases it when the process dies, by
    SIGKILL too: no stale lock is ever left. The file holds the owner's pid, for the message.
    It keeps other processes out; within one process a new lock on the folder takes over from
    an earlier one, which a run that raised (in a notebook, a test) may not have released.
    """

    _held: ClassVar[weakref.WeakValueDictionary[str, RunLock]] = weakref.WeakValueDictionary()

    def __init__(self, run_dir: Path):
        key = os.path.realpath(run_dir)
        if key in RunLock._held:
            RunLock._held[key].release()
        self.fd: Optional[int] = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(self.fd, 32, 0).decode(errors="replace").strip() or "unknown"
            self.release()
            raise ConfigError(f"run folder {run_dir} is in use by another temper process (pid {owner}); "
                              "wait for it to end, or choose another folder") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)
        RunLock._held[key] = self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # the last descriptor of the open file: the lock goes with it
            self.fd = None

    __del__ = release

    @classmethod
    def _forget_in_child(cls) -> None:
        """A forked child (a worker) closes its copy: the lock must end with its owner, not
        with the last child. Closing a copy never unlocks; only LOCK_UN would."""
        for lock in list(cls._held.values()):
            if lock.fd is not None:
                os.close(lock.fd)
                lock.fd = None


os.register_at_fork(after_in_child=RunLock._forget_in_child)


def open_run_dir(run_dir: Optional[str], resume: bool) -> tuple[Path, RunLock]:
    """Make the run folder (a new one under ``runs/`` when None) and lock it for this process.

    The folder is checked again under the lock: another run may have started in it since
    :func:`check_run_dir` looked."""
    path = Path(run_dir) if run_dir else Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot make the run folder {path}: {_cause(exc)}; choose another folder") from None
    lock = RunLock(path)
    try:
        check_run_dir(str(path), resume)
    except ConfigError:
        lock.release()
        raise
    return path, lock


STEP_LOGS = ("metrics.jsonl", "samples.jsonl")
"""A run's logs of one record per step (a command that writes no samples has none to cut)."""
Restored = TypeVar("Restored")


@dataclass
class RunFolder:
    """A run folder this process holds, from its lock to its ``summary.json``."""

    path: Path
    lock: RunLock
    resume_from: Optional[Path]
    """The checkpoint the run continues from; None: it starts at step 0."""

    def start(self, config: TrainConfig, restore: Callable[[Path], Restored]) -> Optional[Restored]:
        """``restore(resume_from)``'s answer for a run that continues; for one that starts, its
        resolved config written and None. Either way the step logs keep only the steps up to
        the one the run continues from, so they have no gaps and no repeats."""
        if self.resume_from is None:
            save_resolved(config, self.path / "config.yaml")
            restored, step = None, 0
        else:
            restored, step = restore(self.resume_from), int(STEP_DIR.match(self.resume_from.name).group(1))
        for name in STEP_LOGS:
            truncate_metrics(self.path / name, step)
        return restored

    def finish(self, summary: dict) -> None:
        """Write ``summary.json`` and let the folder go."""
        (self.path / "summary.json").write_text(json.dumps(summary, indent=2))
        self.lock.release()


def open_run(run_dir: Optional[str], resume: bool) -> RunFolder:
    """The run folder made (see :func:`open_run_dir`) and locked, with the checkpoint that
    ``resume`` continues from (:func:`resume_point`)."""
    path, lock = open_run_dir(run_dir, resume)
    try:
        return RunFolder(path, lock, resume_point(path) if resume else None)
    except ConfigError:
        lock.release()
        raise


def _fsync_tree(path: Path) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as handle:
                os.fsync(handle.fileno())
        _fsync_dir(Path(root))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_model(model: Any, tokenizer: Any, path: Path, merged: bool = True) -> None:
    """``save_pretrained`` for any policy this project loads (GGUF-loaded ones included); a
    policy with LoRA adapters as the merged model, or its adapters alone when not ``merged``."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "quantization_config", None) is not None:
        # a GGUF file was de-quantized on load: the weights are plain tensors now
        del config.quantization_config
    with writing(path):
        saved_form(model, merged).save_pretrained(path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)


def save(run_dir: Path, step: int, model: Any, tokenizer: Any, state: dict[str, Any], keep: int = 2,
         merged: bool = True) -> Path:
    """Write the checkpoint for ``step`` atomically; keep the newest ``keep``; return its path
    (``merged``: how a policy with adapters is saved, see :func:`save_model`).

    A failed write (a full disk) is a :class:`StorageError`; it leaves no partial checkpoint."""
    root = checkpoints_dir(run_dir)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}-{os.getpid()}"
    with writing(final, cleanup=tmp):
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        save_model(model, tokenizer, tmp / "model", merged)
        faults.point("checkpoint")
        torch.save(state, tmp / "trainer.pt")
        manifest = {str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": _sha256(p)}
                    for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / "meta.json").write_text(json.dumps({"step": step, "time": time.time(), "files": manifest}, indent=1))
        _fsync_tree(tmp)
    if final.exists():  # the same step saved again (e.g. after a rollback): replace it
        _remove(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        _remove(old)
    return final


def _remove(path: Path) -> None:
    """Delete a checkpoint so that no instant of the deletion looks like a valid one."""
    doomed = path.with_name(f".del-{path.name}-{os.getpid()}")
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = STEP_DIR.match(path.name)
        if match and (path / "meta.json").is_file() and (path / "trainer.pt").is_file():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def latest(run_dir: Path) -> Optional[Path]:
    """The newest complete checkpoint of a run, or None."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def clean_partial(run_dir: Path) -> list[str]:
    """Remove leftovers of interrupted writes and deletions; return their names."""
    root = checkpoints_dir(run_dir)
    removed = []
    if root.is_dir():
        for path in root.iterdir():
            if path.name.startswith((".tmp-", ".del-")):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path.name)
    return removed


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path: Path) -> Optional[str]:
    """Why the checkpoint at ``path`` cannot be resumed from, or None when its files are intact."""
    try:
        manifest = json.loads((path / "meta.json").read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return "meta.json is unreadable"
    if not any(name.endswith(".safetensors") for name in manifest) or "trainer.pt" not in manifest:
        return "its manifest lists no model weights or no trainer.pt"
    for name, expected in manifest.items():
        file = path / name
        size = expected["size"] if isinstance(expected, dict) else expected  # the earlier format: sizes only
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} is {file.stat().st_size} bytes, the manifest says {size}"
        if isinstance(expected, dict) and _sha256(file) != expected["sha256"]:
            return f"{name} does not match its sha256 (damaged after it was written)"
    if not isinstance(next(iter(manifest.values())), dict):
        return _verify_contents(path, manifest)
    return None


def _verify_contents(path: Path, manifest: dict[str, Any]) -> Optional[str]:
    """What a checkpoint without checksums still allows: the zip CRCs inside ``trainer.pt`` and
    the safetensors headers (tensor names and extents)."""
    from safetensors import safe_open

    try:
        with zipfile.ZipFile(path / "trainer.pt") as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile) as exc:
        return f"trainer.pt is not a readable archive ({exc})"
    if bad is not None:
        return f"trainer.pt: {bad} does not match its CRC"
    for name in (n for n in manifest if n.endswith(".safetensors")):
        try:
            with safe_open(str(path / name), framework="pt") as handle:
                handle.keys()
        except Exception as exc:  # noqa: BLE001  the library's own error type for a bad header
            return f"{name} is not a valid safetensors file ({exc})"
    return None


def usable(run_dir: Path, report: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> Optional[Path]:
    """The newest checkpoint whose files are intact (see :func:`verify`), or None; each newer
    one that is not is reported with why it was skipped."""
    for path in reversed(list_checkpoints(run_dir)):
        reason = verify(path)
        if reason is None:
            return path
        report(f"skipping checkpoint {path}: {reason}")
    return None


def resume_point(run_dir: Path) -> Optional[Path]:
    """The checkpoint ``--resume`` continues from; None for a run that wrote none (it starts over).

    Leftovers of interrupted writes and deletions are removed first, whether the run continues
    or starts over (the caller holds the run's lock, so none is being written). A run whose
    checkpoints are all damaged is refused rather than silently started over."""
    clean_partial(run_dir)
    found = usable(run_dir)
    if found is None and list_checkpoints(run_dir):
        raise ConfigError(f"{run_dir}: no checkpoint is intact (see above); to start the run over, "
                          f"remove {checkpoints_dir(run_dir)} and metrics.jsonl")
    return found


def load_state(path: Path) -> dict[str, Any]:
    """The ``trainer.pt`` of a checkpoint (trusted: written by this run)."""
    return torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)


def load_model_weights(model: Any, path: Path) -> None:
    """Load a checkpoint's policy weights into ``model`` in place, exactly. A policy with LoRA
    adapters has nothing to load here: its base never changes, and its adapters come back
    exactly from ``trainer.pt`` (a merged model could not be split into base and adapters)."""
    if is_adapted(model):
        return
    load_weights_from(model, path / "model")


def rng_state() -> dict[str, Any]:
    """The torch, Python and NumPy generators' states, for a checkpoint's ``rng`` entry."""
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def restore_rng(state: dict[str, Any]) -> None:
    """Put back what :func:`rng_state` saved, so a resumed run draws what the killed one would have."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
