"""Load a model and its tokenizer from a path: a folder, a ``.gguf`` file or a hub id.

- a ``.gguf`` file (dequantized by transformers' GGUF loader, needs the ``gguf`` package;
  ``tempering.models.cache.ensure_converted`` keeps a safetensors copy in the model cache);
- a model directory (checked first: config, weights, every shard, a tokenizer, a causal LM);
- a hub id (from the Hugging Face cache when it is there, else downloaded).

Not here: what a config's ``model.path`` may name beyond a path (``builtin:tiny``, which is
pre-trained on first use, ``builtin:smollm2``, a run or checkpoint folder): ``tempering.policy``
resolves those into one of the above before anything is loaded.
"""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL_LM_CLASSES


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ModelLoadError(ValueError):
    """The model path cannot be loaded; the message says why and what to do."""


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


def load_weights_from(model: Any, folder: Path) -> None:
    """Load the ``*.safetensors`` weights of a ``save_pretrained`` folder into ``model`` in
    place; a RuntimeError when they cannot be read or are not this model's (a tied output
    layer may be absent), checked before any is copied, so the model is then as it was."""
    load_checked(model, read_weights(folder), str(folder))


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of every ``*.safetensors`` file in ``folder``; FileNotFoundError when there
    is none, RuntimeError when one cannot be read."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            weights.update(load_file(file))
        except (SafetensorError, OSError) as exc:
            raise RuntimeError(f"{file}: not a readable safetensors file ({exc})") from None
    return weights


def check_weights(model: Any, weights: dict[str, torch.Tensor], source: str) -> None:
    """A RuntimeError naming ``source`` when ``weights`` are not ``model``'s: a name missing (but
    a tied output layer), one it does not have, or another shape."""
    own = model.state_dict()
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in own if k not in weights and k not in tied and not k.endswith("lm_head.weight")]
    unexpected = [k for k in weights if k not in own]
    reshaped = [f"{k} {tuple(v.shape)} for {tuple(own[k].shape)}" for k, v in weights.items()
                if k in own and v.shape != own[k].shape]
    if missing or unexpected or reshaped:
        raise RuntimeError(f"{source}: the weights do not match the model (missing {missing[:5]}, unexpected "
                           f"{unexpected[:5]}, other shapes {reshaped[:5]})")


def load_checked(model: Any, weights: dict[str, torch.Tensor], source: str) -> None:
    """``weights`` copied into ``model`` in place once :func:`check_weights` passes (none copied otherwise)."""
    check_weights(model, weights, source)
    model.load_state_dict(weights, strict=False)
