"""Policy losses and loss aggregation.

A loss maps :class:`LossInputs` to a per-token loss and a dict of metrics; an aggregation
turns per-token losses into the scalar that is differentiated. Aggregations are told the
whole (mini-)batch's token and sequence counts, so summing the contributions of
micro-batches gives exactly the full-batch value (gradient accumulation changes nothing).

Every loss sees one row per sequence, so a sequence-level loss (GSPO) reduces over ``T``.
Losses return ``-advantage * something``: minimising them raises the probability of tokens
with positive advantage. The entropy bonus and KL term are added by the learner; ``clipped_value_loss`` is the
critic's (PPO with GAE).

Importance ratios are ``exp`` of a log-ratio clamped to ``±LOG_RATIO_LIMIT``: a float32
``exp`` overflows to inf above about 88 and underflows to 0 below about -103, and either
turns a finite batch into NaN losses or gradients (``-0 * inf``, ``0 * inf`` in the backward
pass). Past the clamp a ratio is constant (no gradient); ``e^20`` is far outside any clip
range, so only tokens the clip already stops are affected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from tempering.registry import add


@dataclass
class LossInputs:
    logprobs_BT: torch.Tensor
    """Current policy log-probs of the sampled tokens (with gradient)."""
    old_logprobs_BT: torch.Tensor
    """Log-probs under the policy that sampled them."""
    advantages_BT: torch.Tensor
    mask_BT: torch.Tensor
    clip_low: float = 0.2
    """Ratio clip below 1: ratios under ``1 - clip_low`` stop pulling (PPO, GSPO, CISPO)."""
    clip_high: float = 0.2
    """Ratio clip above 1: ``1 + clip_high``; larger than clip_low is DAPO's clip-higher."""
    dual_clip: float = 3.0
    """Dual clip's bound c > 1: with a negative advantage the loss is at most ``-A * c``."""
    ref_logprobs_BT: Optional[torch.Tensor] = None
    """The reference policy's log-probs, for a loss registered with ``reference=True``; else None."""
    group_B: Optional[torch.Tensor] = None
    """Each row's group (its problem), for a loss registered with ``paired=True``; else None."""
    beta: float = 0.1
    """A preference loss's ``beta``: how far from the reference the policy may move (online_dpo)."""


LOG_RATIO_LIMIT = 20.0
"""Log importance ratios are clamped to ``[-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT]`` before ``exp``."""

LossFn = Callable[[LossInputs], tuple[torch.Tensor, dict[str, float]]]
AggregationFn = Callable[..., torch.Tensor]
"""``fn(loss_BT, mask_BT, batch_tokens, batch_sequences, norm_length) -> scalar``."""
LOSSES: dict[str, LossFn] = {}
AGGREGATIONS: dict[str, AggregationFn] = {}


def register_loss(name: str, zero_at_zero_advantage: bool = False, paired: bool = False, reference: bool = False,
                  advantage: Optional[str] = None) -> Callable[[LossFn], LossFn]:
    """Register a loss. ``zero_at_zero_advantage`` declares that a row whose advantages are
    all 0 has loss 0 and gradient 0 whatever its log-probs, so the learner may leave it out
    of the forward pass (see ``tempering.learner.step``); plug-ins that do not say so are always
    computed in full. ``paired``: a row's loss depends on the other rows of its group
    (``LossInputs.group_B``), so the learner keeps a group's rows in one micro-batch and never
    merges rows. ``reference``: it reads the reference policy's log-probs, so the learner holds
    one whatever the KL coefficient. ``advantage``: the one estimator whose advantages it reads
    (the loop uses it in place of ``algorithm.advantage``)."""
    return lambda fn: add(LOSSES, "loss", name, fn, zero_at_zero_advantage=zero_at_zero_advantage, paired=paired,
                          reference=reference, advantage=advantage)


def zero_at_zero_advantage(loss: LossFn) -> bool:
    return bool(getattr(loss, "zero_at_zero_advantage", False))


def paired(loss: LossFn) -> bool:
    """Whether the loss couples a group's rows (see :func:`register_loss`)."""
    return bool(getattr(loss, "paired", False))


def needs_reference(loss: LossFn) -> bool:
    """Whether the loss reads the reference policy's log-probs (see :func:`register_loss`)."""
    return bool(getattr(loss, "reference", False))


def required_advantage(loss: LossFn) -> Optional[str]:
    """The estimator the loss needs, or None when any will do (see :func:`register_loss`)."""
    return getattr(loss, "advantage", None)


def register_aggregation(name: str) -> Callable[[AggregationFn], AggregationFn]:
    return lambda fn: add(AGGREGATIONS, "aggregation", name, fn)


def masked_mean(values_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    return float((values_BT * mask_BT).sum() / mask_BT.sum().clamp(min=1))


def importance_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """``exp(log_ratio)`` with the log-ratio clamped to ``±LOG_RATIO_LIMIT``, so it is finite.

    >>> importance_ratio(torch.tensor([0.0, 100.0])).tolist() == [1.0, float(torch.tensor(20.0).exp())]
    True
    """
    return torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))


def _clipped_surrogate(inputs: LossInputs, ratio_BT: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """``max(-A * r, -A * clip(r, 1 - low, 1 + high))`` and its clip fraction and mean ratio."""
    unclipped_BT = -inputs.advantages_BT * ratio_BT
    clipped_BT = -inputs.advantages_BT * ratio_BT.clamp(1 - inputs.clip_low, 1 + inputs.clip_high)
    with torch.no_grad():
        metrics = {
            "clip_fraction": masked_mean((clipped_BT > unclipped_BT).float(), inputs.mask_BT),
            "ratio_mean": masked_mean(ratio_BT, inputs.mask_BT),
        }
    return torch.maximum(unclipped_BT, clipped_BT), metrics


@register_loss("ppo_clip", zero_at_zero_advantage=True)
def ppo_clip(inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate, per token: ``max(-A * r, -A * clip(r, 1 - low, 1 + high))``
    with ``r = exp(logp - old_logp)``. Separate low/high ranges allow DAPO's clip-higher."""
    ratio_BT = importance_ratio(inputs.logprobs_BT - inputs.old_logprobs_BT)
    return _clipped_surrogate(inputs, ratio_BT)


@register_loss("dual_clip", zero_at_zero_advantage=True)
def dual_clip(inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clip plus a second bound for negative advantages: ``min(ppo, -A * c)``.

    With A < 0 and a ratio far above 1 (a token the policy now likes much more than the
    sampler did), PPO's loss ``-A * r`` grows without bound; dual clip caps it at ``-A * c``,
    where its gradient is 0. Positive advantages are treated exactly as by ``ppo_clip``.
    """
    ratio_BT = importance_ratio(inputs.logprobs_BT - inputs.old_logprobs_BT)
    loss_BT, metrics = _clipped_surrogate(inputs, ratio_BT)
    capped_BT = torch.minimum(loss_BT, -inputs.advantages_BT * inputs.dual_clip)
    negative_BT = inputs.advantages_BT < 0
    with torch.no_grad():
        metrics["dual_clip_fraction"] = masked_mean((negative_BT & (capped_BT < loss_BT)).float(), inputs.mask_BT)
    return torch.where(negative_BT, capped_BT, loss_BT), metrics


@register_loss("gspo", zero_at_zero_advantage=True)
def gspo(inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO in its token form (GSPO-token): PPO clipping on the sequence's ratio, the geometric
    mean of its token ratios, with each token's own advantage.

    Per token ``log s_t = sg(log s) + logp_t - sg(logp_t)`` with ``log s`` the mean over the
    row's trained tokens of ``logp - old_logp``: every token's ratio has the value ``s`` and
    the gradient ``s`` in its own log-prob only, and gets
    ``max(-A_t * s_t, -A_t * clip(s_t, 1 - low, 1 + high))``. With one advantage per sequence
    (outcome estimators: GRPO and the like) this is GSPO's sequence-level loss, value and
    gradient, under any aggregation that weighs a row's tokens alike. A per-token weight
    applied after the loss (the staleness or mismatch correction) weighs each token's own
    gradient, as in verl, where the sequence-level form spread it over the row. Estimators
    whose advantages vary along a sequence (GAE, REINFORCE++ with gamma < 1 or a per-token KL
    penalty, distillation) keep that per-token credit, each token's clip decision following
    its own advantage's sign. This is verl's ``gspo`` policy loss, whose clamp is ``10`` above
    only; here the log-ratio is clamped to ``±LOG_RATIO_LIMIT`` as in every loss.

    Sequence ratios stay near 1, so GSPO wants much smaller clip ranges than token-level PPO
    (the paper uses 3e-4 and 4e-4) and the aggregation ``seq_mean_token_mean`` to weigh
    sequences equally. The clip fraction counts tokens, not sequences.
    """
    mask_BT = inputs.mask_BT
    with torch.no_grad():
        log_ratio_B = ((inputs.logprobs_BT - inputs.old_logprobs_BT) * mask_BT).sum(-1) / mask_BT.sum(-1).clamp(min=1)
    log_ratio_BT = log_ratio_B[:, None] + inputs.logprobs_BT - inputs.logprobs_BT.detach()
    return _clipped_surrogate(inputs, importance_ratio(log_ratio_BT))


@register_loss("cispo", zero_at_zero_advantage=True)
def cispo(inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO: REINFORCE weighted by the clipped importance ratio, held constant.

    Gradient per token ``-A * clip(r, 1 - low, 1 + high)``: unlike PPO, a clipped token
    still gets a gradient (only its weight is bounded), so rare, high-ratio tokens keep
    learning. Written as ``-A * sg(clip(r)) * exp(logp - sg(logp))``: the last factor is 1
    with gradient 1 in ``logp``, so the value is ``-A * clip(r)`` and the gradient the one
    above, with no division by ``r`` (which is 0 in float32 for log-ratios below about -103).
    """
    ratio_BT = importance_ratio(inputs.logprobs_BT - inputs.old_logprobs_BT)
    clipped_BT = ratio_BT.clamp(1 - inputs.clip_low, 1 + inputs.clip_high)
    unit_BT = torch.exp(inputs.logprobs_BT - inputs.logprobs_BT.detach())
    loss_BT = -inputs.advantages_BT * clipped_BT.detach() * unit_BT
    with torch.no_grad():
        metrics = {
            "clip_fraction": masked_mean((clipped_BT != ratio_BT).float(), inputs.mask_BT),
            "ratio_mean": masked_mean(ratio_BT, inputs.mask_BT),
        }
    return loss_BT, metrics


@register_loss("reinforce", zero_at_zero_advantage=True)
def reinforce(inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """Plain REINFORCE: ``-A * logp``, gradient ``-A`` per token, no importance ratio.

    Unbiased only for on-policy data (one update per batch from fresh samples); with several
    updates per batch prefer a ratio-based loss. The value of the loss depends on ``logp``
    and is not comparable with the ratio-based losses.
    """
    with torch.no_grad():
        ratio_BT = importance_ratio(inputs.logprobs_BT - inputs.old_logprobs_BT)
        metrics = {"ratio_mean": masked_mean(ratio_BT, inputs.mask_BT)}
    return -inputs.advantages_BT * inputs.logprobs_BT, metrics


@register_aggregation("token_mean")
def token_mean(loss_BT: torch.Tensor, mask_BT: torch.Tensor, batch_tokens: int, batch_sequences: int,
               norm_length: int = 1) -> torch.Tensor:
    """Every trained token of the batch weighs the same."""
    return (loss_BT * mask_BT).sum() / max(batch_tokens, 1)


@register_aggregation("seq_mean_token_mean")
def seq_mean_token_mean(loss_BT: torch.Tensor, mask_BT: torch.Tensor, batch_tokens: int,
                        batch_sequences: int, norm_length: int = 1) -> torch.Tensor:
    """Every sequence weighs the same; tokens weigh the same within a sequence."""
    per_sequence_B = (loss_BT * mask_BT).sum(-1) / mask_BT.sum(-1).clamp(min=1)
    return per_sequence_B.sum() / max(batch_sequences, 1)


@register_aggregation("seq_mean_token_sum")
def seq_mean_token_sum(loss_BT: torch.Tensor, mask_BT: torch.Tensor, batch_tokens: int,
                       batch_sequences: int, norm_length: int = 1) -> torch.Tensor:
    """Each sequence's token losses are summed, then sequences averaged: longer sequences
    weigh more, in proportion to their length."""
    return (loss_BT * mask_BT).sum() / max(batch_sequences, 1)


@register_aggregation("token_sum_norm")
def token_sum_norm(loss_BT: torch.Tensor, mask_BT: torch.Tensor, batch_tokens: int,
                   batch_sequences: int, norm_length: int = 1) -> torch.Tensor:
    """Dr. GRPO's aggregation: the token sum divided by ``sequences * norm_length``, a
    constant (the generation budget), so neither a sequence's length nor the batch's token
    count rescales its tokens' gradients."""
    return (loss_BT * mask_BT).sum() / max(batch_sequences * norm_length, 1)


def clipped_value_loss(values_BT: torch.Tensor, old_values_BT: torch.Tensor, returns_BT: torch.Tensor,
                       clip: float) -> torch.Tensor:
    """Per-token ``0.5 * max((v - R)^2, (v_clipped - R)^2)``, ``v_clipped`` within ``clip`` of the old value.

    As PPO's ratio clip, the clipped term stops the value from moving far from the value
    the advantages were computed with in one batch; ``clip = 0`` means no clipping.
    """
    unclipped_BT = (values_BT - returns_BT) ** 2
    if clip <= 0:
        return 0.5 * unclipped_BT
    moved_BT = old_values_BT + (values_BT - old_values_BT).clamp(-clip, clip)
    return 0.5 * torch.maximum(unclipped_BT, (moved_BT - returns_BT) ** 2)
