"""Decoding steps for Llama-architecture models without transformers' per-layer machinery.

A sampling step of a small model on CPU is mostly overhead: the built-in 3M-parameter model
spends about a third of a decoding step (batch 64, bf16) in matrix products and the rest in
the many small operations that transformers' modules run per layer, each with its own
Python and dispatch cost. :class:`LlamaDecoder` computes the same step from the same weights
with fewer, larger operations: fused projections (queries, keys and values in one product,
gate and up in another), torch's fused RMS norm, rotary embeddings as one complex
multiplication for queries and keys together, the mask as an additive bias inside the score
product, keys and values in preallocated buffers that finished rows leave, and, when asked,
float32 products by oneDNN on weights reordered for it (:func:`projection`). For the complex
multiplication, the query and key projections' output rows are reordered so that the two
dimensions rotary embeddings rotate together are adjacent (:func:`interleave_halves`); the
cached keys are in that order too, and attention scores, sums over the dimensions, are
unchanged by it.

Only the decoding steps run here; the prompt's prefill is the model's own forward, whose
cache is copied in. It is used where it computes exactly what the model computes, which
``tempering.models.compat.fused_llama_supported`` checks from the config: ``model_type``
llama, default rotary embeddings, no biases, SiLU MLP, no sliding window; or smollm3, the
same with layers that may go without positions (``no_rope_layers``; such a layer's queries
and keys are not rotated here either). Other models take transformers' path. Weights are read from the model (through ``tempering.models.compat``,
which knows where transformers keeps them) at every :meth:`LlamaDecoder.start`, so a sampler sharing the learner's
model sees each update (the learner's fused AdamW counts no tensor version, so nothing tells
unchanged weights apart cheaply); the projections are copies made there (reordered for
oneDNN, or under bf16 casts), about the size of the model's weights with its output head,
freed with the decoder's next start.

Under bf16 autocast the products run in bf16 and the residual stream, norms, rotary
embeddings and attention in float32, as transformers does under CPU autocast (with
``tempering.models.attention``'s float32 attention).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import torch

from tempering.models.compat import (cache_layers, fused_llama_supported, llama_shape, llama_weights,
                                     select_buffer_rows)


ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
"""Whether this torch has oneDNN's prepacked linear product (:func:`projection`)."""
ONEDNN_AUTO_WIDTH = 512
"""The hidden size from which ``onednn="auto"`` takes oneDNN's products (:func:`wants_onednn`)."""


def wants_onednn(model: Any, setting: bool | str) -> bool:
    """Whether the decoder's float32 products are oneDNN's for ``setting`` (``rollout.onednn``):
    True or False as given; ``"auto"``: for models at least :data:`ONEDNN_AUTO_WIDTH` wide, where
    they decode markedly faster (SmolLM2-135M, 576 wide: 1.3-1.7x at batch 8 to 64 on one thread),
    not for the built-in tiny model (256 wide: 7% slower at batch 8, 7-20% faster at 32 and 64,
    see docs/vllm.md), whose measured runs keep the learner's rounding."""
    if setting == "auto":
        return ONEDNN and getattr(model.config, "hidden_size", 0) >= ONEDNN_AUTO_WIDTH
    if not isinstance(setting, bool):
        raise ValueError(f"onednn must be true, false or 'auto', got {setting!r}")
    return setting


DECODE_ROWS = 32
"""Rows of the decoding step :func:`time_products` times (a step of 4 prompts x 8 samples)."""


def time_products(model: Any, rows: int = DECODE_ROWS, repeats: int = 5) -> dict[str, float]:
    """Seconds of the float32 matrix products of one decoding step of ``model`` (a model
    :func:`~tempering.models.compat.fused_llama_supported` accepts) over ``rows`` rows, on one
    thread, by MKL's products (``mkl_s``, the learner's) and by oneDNN's on reordered weights
    (``onednn_s``): the first layer's four products (queries, keys and values in one; the
    output; gate and up in one; down) times the number of layers, plus the vocabulary head.
    The best of ``repeats`` after an untimed round; the caller's thread count is kept."""
    weights = llama_weights(model)
    first = weights.layers[0]
    shapes = [torch.cat([first.q, first.k, first.v]), first.o, torch.cat([first.gate, first.up]), first.down]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seconds = {}
        for name, onednn in (("mkl_s", False), ("onednn_s", True)):
            layer = [projection(w.float(), None, onednn) for w in shapes]
            head = projection(weights.head.float(), None, onednn)
            x_BH = torch.ones(rows, first.q.shape[1])
            x_BI = torch.ones(rows, first.down.shape[1])

            def step() -> float:
                start = time.perf_counter()
                layer[0](x_BH), layer[1](x_BH), layer[2](x_BH)
                layer[3](x_BI)
                per_layer = time.perf_counter() - start
                start = time.perf_counter()
                head(x_BH)
                return per_layer * len(weights.layers) + time.perf_counter() - start

            step()
            seconds[name] = min(step() for _ in range(repeats))
        return seconds
    finally:
        torch.set_num_threads(threads)


def _rms_norm(x_BH: torch.Tensor, weight_H: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x_BH, weight_H.shape, weight_H, eps)


def projection(weight_OI: torch.Tensor, dtype: Optional[torch.dtype], onednn: bool = False
               ) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x_BI -> x_BI @ weight_OI.T``, computed and returned in ``dtype`` (None: the weight's own).

    With ``onednn``, a float32 product on CPU is oneDNN's, the weight reordered once here into
    its blocked layout (:data:`ONEDNN`; vLLM's CPU backend multiplies so): torch's float32
    ``mm`` is MKL's, 1.5-3x slower at decoding shapes on the AMD EPYC (AVX-512) CPU this was
    measured on, most for the vocabulary head. Both are float32 products, differing only in
    summation order, but the learner's products are MKL's, whose rounding the decoder's then
    no longer shares: SmolLM2's learner/sampler mismatch doubles (3e-6 to 6e-6 per token on
    the same tokens), still below vLLM's own (8.6e-6); :func:`wants_onednn` decides when. Other
    dtypes and devices multiply as the model does."""
    if onednn and dtype is None and ONEDNN and weight_OI.device.type == "cpu" and weight_OI.dtype == torch.float32:
        packed_OI = torch.ops.mkldnn._reorder_linear_weight(weight_OI.contiguous())
        return lambda x_BI: torch.ops.mkldnn._linear_pointwise(x_BI, packed_OI, None, "none", [], "")
    if dtype is None:
        return lambda x_BI: x_BI @ weight_OI.T
    cast_OI = weight_OI.to(dtype)
    return lambda x_BI: x_BI.to(dtype) @ cast_OI.T


def interleave_halves(dim: int, device: torch.device | None = None) -> torch.Tensor:
    """The order of a head's dimensions that puts dimension ``i`` of the first half next to
    dimension ``i`` of the second: the pairs rotary embeddings rotate together.

    >>> interleave_halves(6).tolist()
    [0, 3, 1, 4, 2, 5]
    """
    first = torch.arange(dim // 2, device=device)
    return torch.stack((first, first + dim // 2), dim=1).reshape(-1)


class LlamaDecoder:
    """Decoding steps of a Llama model from a prefilled cache (see the module docstring)."""

    def __init__(self, model: Any, onednn: bool = False):
        if not fused_llama_supported(model):
            raise ValueError("LlamaDecoder supports Llama (and SmolLM3) models with default rotary embeddings, "
                             "no biases and no sliding window")
        self.model = model
        self.onednn = onednn  # float32 products by oneDNN (projection)
        shape = llama_shape(model)
        self.heads, self.kv_heads, self.head_dim = shape.heads, shape.kv_heads, shape.head_dim
        self.eps, self.theta = shape.eps, shape.theta
        self.rotary = shape.rotary

    def start(self, cache: Any, capacity: int, dtype: Optional[torch.dtype], rows: int = 0) -> None:
        """Take the prefilled ``cache`` and this step's weights, in ``dtype`` for the matrix
        products (None: the model's own); keys and values get room for ``capacity`` positions
        and ``rows`` rows (at least the cache's)."""
        weights = llama_weights(self.model)
        device = weights.embed.device
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        pairs = interleave_halves(dim, device)
        # queries' and keys' dimensions in rotation pairs (see the module docstring)
        query_rows = (torch.arange(heads, device=device)[:, None] * dim + pairs).reshape(-1)
        key_rows = (torch.arange(kv_heads, device=device)[:, None] * dim + pairs).reshape(-1)
        self.layers = []
        for layer in weights.layers:
            self.layers.append((
                layer.input_norm.float(),
                projection(torch.cat([layer.q[query_rows], layer.k[key_rows], layer.v]), dtype, self.onednn),
                projection(layer.o, dtype, self.onednn),
                layer.post_norm.float(),
                projection(torch.cat([layer.gate, layer.up]), dtype, self.onednn),
                projection(layer.down, dtype, self.onednn),
            ))
        self.embed = weights.embed
        self.final_norm = weights.final_norm.float()
        self.head = projection(weights.head, dtype, self.onednn)
        self.stores = []  # keys of every layer, then values: [row capacity, key heads, positions, dim]
        layers = cache_layers(cache)
        filled, _, length, _ = layers[0][0].shape
        for tensor in [keys[..., pairs] for keys, _ in layers] + [values for _, values in layers]:
            store = tensor.new_empty((max(rows, filled), tensor.shape[1], capacity, tensor.shape[3]),
                                     dtype=torch.float32)
            store[:filled, :, :length] = tensor
            self.stores.append(store)
        self.length = length
        self.inv_freq = 1.0 / (self.theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))

    def select_rows(self, rows_B: torch.Tensor) -> None:
        """Make the cache's rows ``rows_B`` of the current ones (repeats allowed; see
        ``tempering.models.compat.select_buffer_rows``)."""
        self.stores = select_buffer_rows(self.stores, rows_B, self.length)

    def step(self, ids_B: torch.Tensor, positions_B: torch.Tensor, mask_BS: torch.Tensor) -> torch.Tensor:
        """Logits (float32) after feeding one token per row at ``positions_B``; ``mask_BS``
        (1 = attend) covers the cached positions and this one."""
        with torch.autocast(ids_B.device.type, enabled=False):  # dtypes are managed here
            return self._step(ids_B, positions_B, mask_BS)

    def _step(self, ids_B: torch.Tensor, positions_B: torch.Tensor, mask_BS: torch.Tensor) -> torch.Tensor:
        rows, heads, kv_heads, dim = len(ids_B), self.heads, self.kv_heads, self.head_dim
        group, at, length = heads // kv_heads, self.length, self.length + 1
        angle_BJ = positions_B[:, None].float() * self.inv_freq
        turn_B1J = torch.polar(torch.ones_like(angle_BJ), angle_BJ)[:, None]  # e^(i angle) per rotation pair
        # 0 where a row attends and -inf where not, the same for each key head's queries
        bias_BK1S = torch.zeros((rows, kv_heads, 1, length), device=mask_BS.device).masked_fill_(
            mask_BS[:, None, None, :length] == 0, float("-inf"))
        scaling = dim ** -0.5
        x_BH = self.embed[ids_B].float()
        layers = len(self.layers)
        for (norm_in, qkv, out, norm_post, gate_up, down), keys, values, rotary in zip(
                self.layers, self.stores[:layers], self.stores[layers:], self.rotary):
            keys, values = keys[:rows], values[:rows]
            qkv_BF = qkv(_rms_norm(x_BH, norm_in, self.eps)).float()
            qk_BFD = qkv_BF[:, : (heads + kv_heads) * dim].view(rows, heads + kv_heads, dim)
            if rotary:
                pairs_BFJ2 = qk_BFD.view(rows, heads + kv_heads, dim // 2, 2)
                qk_BFD = torch.view_as_real(torch.view_as_complex(pairs_BFJ2) * turn_B1J).view(rows, heads + kv_heads, dim)
            keys[:, :, at] = qk_BFD[:, heads:]
            values[:, :, at] = qkv_BF[:, (heads + kv_heads) * dim :].view(rows, kv_heads, dim)
            q_BKMD = qk_BFD[:, :heads].reshape(rows, kv_heads, group, dim)
            k_BKSD, v_BKSD = keys[:, :, :length], values[:, :, :length]
            # the batched products take rows and key heads on one axis
            scores_BKMS = torch.baddbmm(bias_BK1S.flatten(0, 1), q_BKMD.flatten(0, 1),
                                        k_BKSD.reshape(-1, length, dim).transpose(1, 2), alpha=scaling
                                        ).view(rows, kv_heads, group, length)
            probs_BKMS = torch.softmax(scores_BKMS, dim=-1)
            attended_BF = torch.bmm(probs_BKMS.flatten(0, 1), v_BKSD.reshape(-1, length, dim)).view(rows, heads * dim)
            x_BH = x_BH + out(attended_BF).float()
            gate_BF, up_BF = gate_up(_rms_norm(x_BH, norm_post, self.eps)).chunk(2, dim=-1)
            x_BH = x_BH + down(torch.nn.functional.silu(gate_BF) * up_BF).float()
        self.length = length
        return self.head(_rms_norm(x_BH, self.final_norm, self.eps)).float()
