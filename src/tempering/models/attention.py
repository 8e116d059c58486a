"""Attention under bfloat16 autocast on CPU: batched products for short rows, float32 sdpa otherwise.

torch's CPU attention kernels (``scaled_dot_product_attention``) run about 3x slower in
bfloat16 than in float32 at the learner's shapes (torch 2.13 on an AVX-512 CPU with bf16
instructions: forward and backward of 60 rows x 4 heads x 35 tokens x 64 dims, 184 ms in
bf16 against 56-62 ms in fp32), while bfloat16 matrix products run about 4.5x faster than
fp32 ones. :func:`upcast_attention` switches a model to transformers' sdpa attention wrapped
to do better while CPU autocast is on: rows of at most :data:`SHORT` keys take
:func:`matmul_attention` (two bf16 batched products, the softmax in float32, as transformers'
eager attention does under autocast: 4x faster than the fp32 kernel for 128 heads of 35
tokens), longer ones the sdpa kernel in float32. On the built-in model's learner the bf16
products move log-probs by about 1e-6 (at most 7e-5) from the float32-attention ones, a
hundredth of the bf16-vs-fp32 difference. Without autocast, or on other devices, the wrapper
is plain sdpa. The attention implementation is not saved with a checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch

from tempering.models.compat import register_attention, sdpa_attention_forward, switch_sdpa_attention

NAME = "cpu_autocast_attention"


SHORT = 128
"""Rows of up to this many keys take :func:`matmul_attention` under CPU autocast."""


def matmul_attention(query_BAQD: torch.Tensor, key_BKSD: torch.Tensor, value_BKSD: torch.Tensor,
                     mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
    """``softmax(q k^T * scaling + mask) v`` with two batched products in the inputs' dtype and
    the softmax in float32; ``mask`` is boolean (True = attend) or None for causal attention
    (query i sees keys up to ``i + keys - queries``). Returns ``[batch, queries, heads, dim]``
    as transformers' sdpa wrapper does."""
    batch, heads, queries, dim = query_BAQD.shape
    kv_heads, keys = key_BKSD.shape[1], key_BKSD.shape[2]
    group = heads // kv_heads
    if mask is None:
        mask = torch.ones((queries, keys), dtype=torch.bool, device=query_BAQD.device).tril(keys - queries)
    # a key head's M query heads with their Q queries each, on one axis of M * Q
    q_BKMD = query_BAQD.reshape(batch, kv_heads, group * queries, dim)
    scores_BKMS = torch.matmul(q_BKMD, key_BKSD.transpose(-1, -2)).mul_(scaling)
    # the lowest finite value rather than -inf: a query that may see no key (a left-padded
    # prompt's padding) gets an average of the values instead of NaN, as sdpa gives it 0
    scores_BAQS = scores_BKMS.view(batch, heads, queries, keys).float().masked_fill_(
        ~mask, torch.finfo(torch.float32).min)
    probs_BKMS = torch.softmax(scores_BAQS, dim=-1).to(value_BKSD.dtype).view(batch, kv_heads, group * queries, keys)
    out_BKMD = torch.matmul(probs_BKMS, value_BKSD)
    return out_BKMD.view(batch, heads, queries, dim).transpose(1, 2).contiguous()


def _plain(module, kwargs) -> bool:
    """Whether a call is one :func:`matmul_attention` computes exactly: no dropout, bias, soft-cap or sinks."""
    return (not kwargs.get("dropout") or not module.training) and all(
        kwargs.get(name) is None for name in ("position_bias", "softcap", "s_aux", "sinks"))


def _cpu_autocast_attention(module, query, key, value, attention_mask, **kwargs):
    if query.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    low = torch.get_autocast_dtype("cpu")
    with torch.autocast("cpu", enabled=False):
        if query.shape[2] > 1 and key.shape[2] <= SHORT and _plain(module, kwargs) and (
                attention_mask is None or attention_mask.dtype == torch.bool):
            scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
            return matmul_attention(query.to(low), key.to(low), value.to(low), attention_mask, scaling), None
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask,
                                              **kwargs)
    return out.to(low), weights


register_attention(NAME, _cpu_autocast_attention)


def upcast_attention(model: Any) -> None:
    """Give ``model``'s sdpa attention the CPU autocast treatment of the module docstring; other
    implementations stay."""
    switch_sdpa_attention(model, NAME)
