"""Attention in float32 under bfloat16 autocast on CPU.

torch's CPU attention kernels (``scaled_dot_product_attention``) run about 3x slower in
bfloat16 than in float32 at the learner's shapes (torch 2.13 on an AVX-512 CPU with bf16
instructions: forward and backward of 60 rows x 4 heads x 35 tokens x 64 dims, 184 ms in
bf16 against 56-62 ms in fp32), while bfloat16 matrix products run about 4.5x faster than
fp32 ones. The best of both is bf16 projections and MLPs with attention itself in fp32:
:func:`upcast_attention` switches a model to transformers' sdpa attention wrapped to do
that while CPU autocast is on. Without autocast, or on other devices, the wrapper is plain
sdpa. The attention implementation is not saved with a checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "sdpa_fp32_under_cpu_autocast"


def _sdpa_fp32_under_cpu_autocast(module, query, key, value, attention_mask, **kwargs):
    if query.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    with torch.autocast("cpu", enabled=False):
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask,
                                              **kwargs)
    return out.to(torch.get_autocast_dtype("cpu")), weights


AttentionInterface.register(NAME, _sdpa_fp32_under_cpu_autocast)
AttentionMaskInterface.register(NAME, sdpa_mask)


def upcast_attention(model: Any) -> None:
    """Run ``model``'s sdpa attention in float32 under CPU bf16 autocast; other implementations stay."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(NAME)
