"""Checkpoints that hold a run's whole state, written so a crash can never leave a bad one.

A checkpoint is a directory ``<run>/checkpoints/step-NNNNNNNN/`` holding

- ``model/``: the policy as ``save_pretrained`` writes it, with the tokenizer, so
  ``AutoModelForCausalLM.from_pretrained`` loads it directly;
- ``trainer.pt``: everything else, one ``torch.save`` of plain containers and tensors —
  optimizer and LR schedule, the learner's version and KL coefficient, critic and reference
  weights when they exist, scheduler statistics and task cursors, reward normalizer and
  monitor statistics, the RNG states of every worker, rollouts buffered but not yet
  trained on, and the loop's counters;
- ``meta.json``: step, time and file sizes, written last.

Writing is atomic: everything goes into a hidden ``.tmp-step-…`` directory, each file is
fsynced, the directory is renamed into place and its parent fsynced. A directory whose
name is not exactly ``step-NNNNNNNN``, or that lacks ``meta.json``, is never a candidate
for resume, so a checkpoint interrupted at any instant is ignored and cleaned up later.
Older checkpoints beyond ``keep`` are renamed away before they are deleted, for the same
reason.

Not done here: sharded (multi-rank) checkpoints and remote storage.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Optional

import torch

from tempering import faults

STEP_DIR = re.compile(r"^step-(\d{8})$")


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


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


def save_model(model: Any, tokenizer: Any, path: Path) -> None:
    """``save_pretrained`` for any policy this project loads (GGUF-loaded ones included)."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "quantization_config", None) is not None:
        # a GGUF file was de-quantized on load: the weights are plain tensors now
        del config.quantization_config
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)


def save(run_dir: Path, step: int, model: Any, tokenizer: Any, state: dict[str, Any], keep: int = 2) -> Path:
    """Write the checkpoint for ``step`` atomically; keep the newest ``keep``; return its path."""
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_model(model, tokenizer, tmp / "model")
    faults.point("checkpoint")
    torch.save(state, tmp / "trainer.pt")
    sizes = {str(p.relative_to(tmp)): p.stat().st_size for p in tmp.rglob("*") if p.is_file()}
    (tmp / "meta.json").write_text(json.dumps({"step": step, "time": time.time(), "files": sizes}, indent=1))
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


def load_state(path: Path) -> dict[str, Any]:
    """The ``trainer.pt`` of a checkpoint (trusted: written by this run)."""
    return torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)


def load_model_weights(model: Any, path: Path) -> None:
    """Load a checkpoint's policy weights into ``model`` in place, exactly."""
    from safetensors.torch import load_file

    files = sorted((path / "model").glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path / 'model'}: no safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(file))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    really_missing = [k for k in missing if k not in tied and not k.endswith("lm_head.weight")]
    if really_missing or unexpected:
        raise RuntimeError(f"{path}: checkpoint does not match the model "
                           f"(missing {really_missing[:5]}, unexpected {unexpected[:5]})")
