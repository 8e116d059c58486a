"""Policy losses and loss aggregation.

A loss maps :class:`LossInputs` to a per-token loss and a dict of metrics; an aggregation
turns per-token losses into the scalar that is differentiated. Aggregations are told the
whole batch's token and sequence counts, so summing the contributions of micro-batches
gives exactly the full-batch value (gradient accumulation changes nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class LossInputs:
    logprobs_BT: torch.Tensor
    """Current policy log-probs of the sampled tokens (with gradient)."""
    old_logprobs_BT: torch.Tensor
    """Log-probs under the policy that sampled them."""
    advantages_BT: torch.Tensor
    mask_BT: torch.Tensor
    clip_low: float = 0.2
    clip_high: float = 0.2


LossFn = Callable[[LossInputs], tuple[torch.Tensor, dict[str, float]]]
AggregationFn = Callable[[torch.Tensor, torch.Tensor, int, int], torch.Tensor]
LOSSES: dict[str, LossFn] = {}
AGGREGATIONS: dict[str, AggregationFn] = {}


def register_loss(name: str) -> Callable[[LossFn], LossFn]:
    def decorator(fn: LossFn) -> LossFn:
        if name in LOSSES:
            raise ValueError(f"loss {name!r} is registered twice")
        LOSSES[name] = fn
        return fn

    return decorator


def register_aggregation(name: str) -> Callable[[AggregationFn], AggregationFn]:
    def decorator(fn: AggregationFn) -> AggregationFn:
        if name in AGGREGATIONS:
            raise ValueError(f"aggregation {name!r} is registered twice")
        AGGREGATIONS[name] = fn
        return fn

    return decorator


def masked_mean(values_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    return float((values_BT * mask_BT).sum() / mask_BT.sum().clamp(min=1))


@register_loss("ppo_clip")
def ppo_clip(inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate, per token: ``max(-A * r, -A * clip(r, 1 - low, 1 + high))``
    with ``r = exp(logp - old_logp)``. Separate low/high ranges allow DAPO's clip-higher."""
    ratio_BT = torch.exp(inputs.logprobs_BT - inputs.old_logprobs_BT)
    unclipped_BT = -inputs.advantages_BT * ratio_BT
    clipped_BT = -inputs.advantages_BT * ratio_BT.clamp(1 - inputs.clip_low, 1 + inputs.clip_high)
    loss_BT = torch.maximum(unclipped_BT, clipped_BT)
    with torch.no_grad():
        metrics = {
            "clip_fraction": masked_mean((clipped_BT > unclipped_BT).float(), inputs.mask_BT),
            "ratio_mean": masked_mean(ratio_BT, inputs.mask_BT),
        }
    return loss_BT, metrics


@register_aggregation("token_mean")
def token_mean(loss_BT: torch.Tensor, mask_BT: torch.Tensor, batch_tokens: int, batch_sequences: int) -> torch.Tensor:
    """Every trained token of the batch weighs the same."""
    return (loss_BT * mask_BT).sum() / max(batch_tokens, 1)


@register_aggregation("seq_mean_token_mean")
def seq_mean_token_mean(loss_BT: torch.Tensor, mask_BT: torch.Tensor, batch_tokens: int,
                        batch_sequences: int) -> torch.Tensor:
    """Every sequence weighs the same; tokens weigh the same within a sequence."""
    per_sequence_B = (loss_BT * mask_BT).sum(-1) / mask_BT.sum(-1).clamp(min=1)
    return per_sequence_B.sum() / max(batch_sequences, 1)
