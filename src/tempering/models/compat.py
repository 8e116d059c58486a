"""Every use of transformers beyond its public model API, so that a release that moves or
renames one of them breaks this file only.

tempering otherwise calls a model as any user would (``forward`` with ids, masks and
positions, ``get_decoder``, ``get_output_embeddings``, ``config``). What it needs beyond that:

- cache classes: transformers' layered ``DynamicCache`` (a cache of plain full-attention
  layers, when a model's layers are all such), a layer preallocated for the sampler, a
  cache's rows selected and its keys and values read;
- forward arguments that changed name: the cache (``cache`` since transformers 5,
  ``past_key_values`` before) and how many positions to make logits for
  (``logits_to_keep``, ``num_logits_to_keep`` before);
- the gradient-checkpointing flag (``is_activation_checkpointing`` since transformers 5);
- attention registration: an attention function registered beside sdpa, with sdpa's
  masks, transformers' sdpa wrapper, and switching a model from sdpa to it;
- a Llama model's modules, weights and rotary settings, read for
  ``tempering.rollout.fast_llama``, and the config checks that say its fused decoder
  computes what the model does.

Written against transformers 5; a release without layered caches gets no preallocated
cache and no shared prompts (both need one), not an error.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

try:
    from transformers.cache_utils import DynamicCache, DynamicLayer
except ImportError:  # transformers releases before the layered cache
    DynamicCache = DynamicLayer = None

__all__ = [
    "LlamaLayerWeights", "LlamaShape", "LlamaWeights", "cache_argument", "cache_layers", "checkpointing",
    "full_attention_cache", "fused_llama_supported", "llama_shape", "llama_weights", "logits_to_keep_argument",
    "preallocated_cache", "register_attention", "sdpa_attention_forward", "select_buffer_rows",
    "select_cache_rows", "switch_sdpa_attention",
]


def cache_argument(forward: Callable) -> str:
    """The name under which ``forward`` takes its key/value cache and its output returns it."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def logits_to_keep_argument(forward: Callable) -> Optional[str]:
    """The argument of ``forward`` that limits logits to the last positions, or None if it has none."""
    parameters = inspect.signature(forward).parameters
    return next((name for name in ("logits_to_keep", "num_logits_to_keep") if name in parameters), None)


def checkpointing(model: Any) -> bool:
    """Whether ``model`` recomputes its layers in the backward pass."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name) or hasattr(model, name):
            return bool(getattr(model, name))
    return False


def enable_checkpointing(model: Any) -> None:
    """Make ``model`` recompute its layers in the backward pass (transformers 5 renamed the method)."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def full_attention_cache(config: Any) -> Optional[Any]:
    """A new ``DynamicCache`` for a model with this config when every layer of it is plain
    full attention (keys and values appended position by position), else None (sliding
    windows, recurrent states, or a transformers release without layered caches)."""
    if DynamicCache is None:
        return None
    cache = DynamicCache(config=config)
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    return cache


def preallocated_cache(config: Any, capacity: int, dtype: Optional[torch.dtype]) -> Optional[Any]:
    """:func:`full_attention_cache` with each layer a :class:`PreallocatedLayer` of room for
    ``capacity`` positions in ``dtype`` (None: the keys' own); None where that is None."""
    cache = full_attention_cache(config)
    if cache is not None:
        cache.layers = [PreallocatedLayer(capacity, dtype) for _ in cache.layers]
    return cache


def select_cache_rows(cache: Any, rows_B: torch.Tensor) -> None:
    """Make ``cache``'s rows the rows ``rows_B`` of its current ones (repeats allowed)."""
    cache.batch_select_indices(rows_B)


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(keys, values)`` of each layer of ``cache``, each ``[rows, key heads, positions, head width]``."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def select_buffer_rows(stores: list[torch.Tensor], rows_B: torch.Tensor, length: int) -> list[torch.Tensor]:
    """Cache storage ``[row capacity, heads, positions, dim]`` rearranged so that its first
    ``len(rows_B)`` rows hold rows ``rows_B`` (repeats allowed), of which only the first
    ``length`` positions are filled and copied; returns the storage (new, larger, when the
    selection does not fit).

    Only the rows whose content changes are copied, from a gathered copy of their sources, so
    any selection is safe in place: a finished row's hole filled from the end, a row copied
    into a free one (a sample that diverges from the rows it was decoded with)."""
    count = len(rows_B)
    if count > len(stores[0]):
        grown = []
        for store in stores:  # positions beyond the filled ones are never read
            new = store.new_empty((count,) + store.shape[1:])
            new[:, :, :length] = store[rows_B, :, :length]
            grown.append(new)
        return grown
    moved = (rows_B != torch.arange(count, device=rows_B.device)).nonzero()[:, 0]
    if len(moved):
        for store in stores:
            store[moved, :, :length] = store[rows_B[moved], :, :length]
    return stores


if DynamicLayer is not None:
    class PreallocatedLayer(DynamicLayer):
        """One layer's keys and values in buffers with room for ``capacity`` positions: a
        step writes its position in place, and ``keys``/``values`` are views of the filled
        part (``DynamicLayer`` copies the whole layer to append one position).

        ``dtype`` bfloat16 under bf16 autocast: rotary embeddings leave keys in float32 there,
        and attention would otherwise cast the whole cache to bf16 at every step. Only what
        the sampler's loop calls is kept consistent with the buffers: ``update`` and
        ``batch_select_indices``."""

        def __init__(self, capacity: int, dtype: Optional[torch.dtype] = None):
            super().__init__()
            self.capacity = capacity
            self.dtype = dtype

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.device = key_states.device
            rows, heads, _, dim = key_states.shape
            dtype = self.dtype or key_states.dtype
            # stores keep their row capacity; buffers are views of the rows in use
            self._key_store = self._key_buffer = key_states.new_empty(rows, heads, self.capacity, dim, dtype=dtype)
            self._value_store = self._value_buffer = value_states.new_empty(rows, heads, self.capacity,
                                                                            value_states.shape[3], dtype=dtype)
            self.keys, self.values = self._key_buffer[:, :, :0], self._value_buffer[:, :, :0]
            self.is_initialized = True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            start = self.keys.shape[-2]
            end = start + key_states.shape[-2]
            self._key_buffer[:, :, start:end] = key_states
            self._value_buffer[:, :, start:end] = value_states
            self.keys, self.values = self._key_buffer[:, :, :end], self._value_buffer[:, :, :end]
            return self.keys, self.values

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            """Make the rows ``indices`` of the current ones (repeats allowed), copying only the
            filled positions of changed rows (:func:`select_buffer_rows`)."""
            if not self.is_initialized:
                return
            length, rows = self.keys.shape[-2], len(indices)
            self._key_store, self._value_store = select_buffer_rows(
                [self._key_store, self._value_store], indices, length)
            self._key_buffer, self._value_buffer = self._key_store[:rows], self._value_store[:rows]
            self.keys, self.values = self._key_buffer[:, :, :length], self._value_buffer[:, :, :length]


def register_attention(name: str, forward: Callable) -> None:
    """Make ``forward`` (the signature of ``sdpa_attention_forward``) the attention
    implementation ``name``, with the masks sdpa takes (boolean, or None for causal)."""
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, sdpa_mask)


def switch_sdpa_attention(model: Any, name: str) -> None:
    """Switch ``model`` to the registered attention ``name`` if it uses sdpa; other implementations stay."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(name)


FUSED_MODEL_TYPES = ("llama", "smollm3")
"""Model types the fused decoder takes: Llama, and SmolLM3 (a Llama whose layers may each go
without rotary positions, ``no_rope_layers``: ``builtin:tiny-long``)."""


def fused_llama_supported(model: Any) -> bool:
    """Whether ``tempering.rollout.fast_llama`` computes exactly what ``model`` computes: a
    Llama (or SmolLM3) with default rotary embeddings, no biases, a SiLU MLP and no sliding
    window, and no LoRA adapters (its projections are then more than their weights;
    ``tempering.models.lora``)."""
    if hasattr(model, "peft_config"):
        return False
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in FUSED_MODEL_TYPES:
        return False
    if getattr(config, "use_sliding_window", False):
        return False
    rope = getattr(config, "rope_parameters", None) or {}
    return (rope.get("rope_type", "default") == "default" and "rope_theta" in rope
            and not getattr(config, "attention_bias", False) and not getattr(config, "mlp_bias", False)
            and getattr(config, "hidden_act", None) == "silu" and not getattr(config, "sliding_window", None)
            and getattr(config, "pretraining_tp", 1) == 1)


@dataclass(frozen=True)
class LlamaShape:
    """What a Llama model's decoding step needs from its config besides weights."""

    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    """The RMS norms' epsilon."""
    theta: float
    """The rotary embeddings' base."""
    rotary: tuple[bool, ...]
    """Per layer, whether its attention rotates queries and keys by position (False: a SmolLM3
    layer without positions)."""


def attention_shape(config: Any) -> tuple[int, int, int]:
    """``(query heads, key/value heads, head width)`` of a decoder's config: the key/value
    heads are the query heads where the config names none (no grouped-query attention), the
    head width the hidden size over the heads where it names none. The sampler's cache
    budget, the learner's memory estimate and the fused decoder all read the shape here.

    >>> from types import SimpleNamespace
    >>> attention_shape(SimpleNamespace(num_attention_heads=9, num_key_value_heads=3, hidden_size=576))
    (9, 3, 64)
    >>> attention_shape(SimpleNamespace(num_attention_heads=4, hidden_size=64, head_dim=None))
    (4, 4, 16)
    """
    heads = config.num_attention_heads
    return (heads, getattr(config, "num_key_value_heads", None) or heads,
            getattr(config, "head_dim", None) or config.hidden_size // heads)


def llama_shape(model: Any) -> LlamaShape:
    """The :class:`LlamaShape` of a model :func:`fused_llama_supported` accepts."""
    config = model.config
    heads, kv_heads, head_dim = attention_shape(config)
    rotary = tuple(bool(getattr(layer.self_attn, "use_rope", True)) for layer in model.model.layers)
    return LlamaShape(heads=heads, kv_heads=kv_heads, head_dim=head_dim, eps=config.rms_norm_eps,
                      theta=config.rope_parameters["rope_theta"], rotary=rotary)


@dataclass(frozen=True)
class LlamaLayerWeights:
    """One decoder layer's weights (detached views of the model's own), as ``nn.Linear``
    stores them: ``[out features, in features]``."""

    input_norm: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    post_norm: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor


@dataclass(frozen=True)
class LlamaWeights:
    """A Llama model's weights (detached views, so updates to the model show through)."""

    embed: torch.Tensor
    layers: list[LlamaLayerWeights]
    final_norm: torch.Tensor
    head: torch.Tensor


def llama_weights(model: Any) -> LlamaWeights:
    """The :class:`LlamaWeights` of a model :func:`fused_llama_supported` accepts."""
    base = model.model
    layers = [LlamaLayerWeights(
        input_norm=layer.input_layernorm.weight.detach(), q=layer.self_attn.q_proj.weight.detach(),
        k=layer.self_attn.k_proj.weight.detach(), v=layer.self_attn.v_proj.weight.detach(),
        o=layer.self_attn.o_proj.weight.detach(), post_norm=layer.post_attention_layernorm.weight.detach(),
        gate=layer.mlp.gate_proj.weight.detach(), up=layer.mlp.up_proj.weight.detach(),
        down=layer.mlp.down_proj.weight.detach()) for layer in base.layers]
    return LlamaWeights(embed=base.embed_tokens.weight.detach(), layers=layers,
                        final_norm=base.norm.weight.detach(), head=model.lm_head.weight.detach())
