"""LoRA adapters on a policy, through ``peft``: the one file that knows peft.

With ``model.lora`` set, :func:`apply_lora` wraps the loaded policy so that only the adapters'
A and B matrices train; the base weights are frozen. What that changes elsewhere:

- the KL reference of RL is the same model with its adapters switched off
  (:func:`adapters_off`, peft's ``disable_adapter()``): the frozen base *is* the initial
  policy, so no second copy of the model is kept;
- the sampler runs the adapted modules themselves (transformers' path), not the fused Llama
  decoder, which reads plain projection weights (``tempering.models.compat``): it then
  computes exactly what the learner differentiates, whatever modules are adapted;
- checkpoints hold the merged model (a plain model ``from_pretrained`` loads) or only the
  adapters (:func:`saved_form`); either way the adapter weights themselves travel in
  ``trainer.pt`` (:func:`adapter_state`), so a resumed run continues from them exactly and
  never has to undo a merge;
- an inference server samples with the learner's adapters when they are written as peft's
  files (:func:`save_adapters`) and loaded onto its plain base (:func:`serve_adapter`).

Not done here: several adapters at once, QLoRA (quantized bases), DoRA and other peft methods.
"""

from __future__ import annotations

import copy
import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any, ContextManager, Optional, Sequence

import torch

from tempering.config import ConfigError

INSTALL = "pip install 'tempering[lora]'"


def _peft():
    try:
        import peft
    except ImportError:
        raise ConfigError(f"model.lora needs the peft package: {INSTALL}") from None
    return peft


def apply_lora(model: Any, rank: int, alpha: float, dropout: float, target_modules: str | Sequence[str]) -> Any:
    """``model`` wrapped with fresh LoRA adapters (B = 0, so it computes what it did); only
    the adapters require gradients. A target that matches no module is a ConfigError."""
    peft = _peft()
    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    spec = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                           task_type="CAUSAL_LM")
    try:
        return peft.get_peft_model(model, spec)
    except ValueError as exc:
        raise ConfigError(f"model.lora.target_modules={target_modules!r}: {exc}") from None


def is_adapted(model: Any) -> bool:
    """Whether ``model`` carries peft adapters."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def unwrapped(model: Any) -> Any:
    """The transformers model inside ``model`` (itself without adapters), e.g. to read which
    arguments its ``forward`` takes: peft's wrapper passes them on as ``**kwargs``."""
    return model.get_base_model() if is_adapted(model) else model


def adapters_off(model: Any) -> ContextManager:
    """A context in which ``model`` computes as its base (adapters switched off); a no-op
    for a model without adapters."""
    return model.disable_adapter() if is_adapted(model) else nullcontext()


def adapter_state(model: Any) -> Optional[dict[str, torch.Tensor]]:
    """The adapters' weights (copies, on CPU), or None for a model without adapters."""
    if not is_adapted(model):
        return None
    state = _peft().get_peft_model_state_dict(model)
    return {name: tensor.detach().cpu().clone() for name, tensor in state.items()}


def load_adapter_state(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Put adapter weights saved by :func:`adapter_state` back, exactly."""
    result = _peft().set_peft_model_state_dict(model, state)
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise RuntimeError(f"saved adapter weights do not match this model's adapters (unexpected {unexpected[:5]})")


def merged_copy(model: Any) -> Any:
    """A plain model computing what the adapted ``model`` computes (adapters folded into the
    base weights); ``model`` itself is left as it is."""
    return copy.deepcopy(model).merge_and_unload()


def saved_form(model: Any, merged: bool) -> Any:
    """What ``save_pretrained`` is called on to save ``model``: an adapted model's merged copy,
    or the adapted model itself when not ``merged`` (peft then writes the adapters alone:
    ``adapter_config.json`` and ``adapter_model.safetensors``); a plain model as it is."""
    if not is_adapted(model):
        return model
    return merged_copy(model) if merged else model


def save_adapters(model: Any, weights: dict[str, torch.Tensor], folder: Path) -> None:
    """Write the adapters held in ``weights`` (a state dict of the adapted ``model``, perhaps
    newer than ``model`` itself) to ``folder`` as peft's ``save_pretrained`` does, so that a
    server (``temper serve``, vLLM) loads them as a LoRA adapter."""
    from safetensors.torch import save_file

    state = _peft().get_peft_model_state_dict(model, state_dict=weights, save_embedding_layers=False)
    folder.mkdir(parents=True, exist_ok=True)
    model.peft_config[model.active_adapter].save_pretrained(str(folder))
    partial = folder / "adapter_model.safetensors.partial"
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(partial))
    os.replace(partial, folder / "adapter_model.safetensors")  # a reader never sees half a file


def serve_adapter(model: Any, folder: Path, name: str) -> Any:
    """``model`` with the adapter saved in ``folder`` loaded as ``name`` and active, in place
    of any adapter it had (one at a time); a plain model is wrapped the first time (the
    returned model is then a new wrapper around it). A folder that is not a peft adapter of
    this model raises ValueError, FileNotFoundError or RuntimeError."""
    peft = _peft()
    if not is_adapted(model):
        return peft.PeftModel.from_pretrained(model, str(folder), adapter_name=name)
    for old in list(model.peft_config):
        model.delete_adapter(old)
    model.load_adapter(str(folder), adapter_name=name)
    model.set_adapter(name)
    return model
