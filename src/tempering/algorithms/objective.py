"""The whole RL objective of one (micro-)batch, as one function of tensors.

Per trained token::

    loss_BT = policy_loss(ratio to the anchor, advantage)    # LOSSES[algorithm.loss]
              * behaviour weight                             # staleness or engine-mismatch correction
              * row weight                                   # the scheduler's per-domain balance (weights_B)
              - entropy_coef * entropy                       # the entropy bonus
              + kl_coef * KL(policy || reference)            # the KL term, when it is in the loss
              + value_coef * clipped value loss              # the critic's (PPO with GAE)

and the scalar differentiated is ``aggregation(loss_BT)`` (``AGGREGATIONS``), normalised by
the whole mini-batch's token and sequence counts, so micro-batches sum to the full batch.

The anchor of the importance ratio is the sampler's log-probs, or the proximal policy's
(these weights at the start of the step) when one is given; the behaviour weight is then
``pi_prox / pi_sampler`` (detached, its log clamped to ``±LOG_RATIO_LIMIT`` as every ratio's),
truncated at ``is_cap`` for ``off_policy="tis"`` and left whole for ``"decoupled"``, or, with
``mismatch_correction`` (a sampler that is not the learner), that variant of
``tempering.algorithms.correction`` in its place. Each term is present when its inputs are: no
proximal log-probs, no correction; no ``weights_B``, every row weighs 1; no reference
log-probs or a KL coefficient of 0, no KL term; no values, no value loss. The policy loss sees
the reference's log-probs, each row's group and ``dpo_beta`` too (a preference loss such as
``online_dpo`` reads them; the others ignore them).

Not here: running the policy, the reference or the critic (``tempering.learner``), deciding
when a proximal policy is needed (the learner's: for stale rollouts, and for every batch with
a mismatch correction), and the KL
coefficient's adaptation (``tempering.algorithms.kl.KLCoefficient``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from tempering.algorithms.correction import correct
from tempering.algorithms.kl import kl_estimate
from tempering.algorithms.losses import (AggregationFn, LossFn, LossInputs, clipped_value_loss, importance_ratio,
                                         masked_mean)


@dataclass(kw_only=True)
class ObjectiveSettings:
    """The objective's choices and coefficients (every field required: the learner's settings
    extend these, filled from the config by ``tempering.build.learner_settings``)."""

    loss: LossFn
    aggregation: AggregationFn
    clip_low: float
    clip_high: float
    dual_clip: float
    norm_length: int
    """The aggregation's constant (``token_sum_norm``)."""
    entropy_coef: float
    kl_estimator: str
    kl_clamp: float
    """Bound on each token's KL estimate; 0 = none."""
    value_coef: float
    value_clip: float
    off_policy: str
    """Correction for stale rollouts: "none", "tis" or "decoupled" (see the module docstring)."""
    is_cap: float
    """Truncation of the behaviour weight for "tis"."""
    mismatch_correction: str
    """Correction for a sampler that is not the learner, on every batch: "none" or a name in
    ``tempering.algorithms.correction.CORRECTIONS``."""
    mismatch_low: float
    mismatch_high: float
    """The band of ``pi_prox / pi_sampler`` that correction keeps (truncates at ``mismatch_high``)."""
    dpo_beta: float
    """A preference loss's ``beta`` (``online_dpo``)."""


@dataclass
class ObjectiveInputs:
    logprobs_BT: torch.Tensor
    """The policy's log-probs of the sampled tokens (with gradient)."""
    sampler_logprobs_BT: torch.Tensor
    """Log-probs under the policy that sampled them."""
    advantages_BT: torch.Tensor
    mask_BT: torch.Tensor
    entropy_BT: torch.Tensor
    """The policy's entropy per token (with gradient when the bonus is on)."""
    batch_tokens: int
    batch_sequences: int
    """The whole mini-batch's trained tokens and sequences, which the aggregation divides by."""
    prox_logprobs_BT: Optional[torch.Tensor] = None
    """The proximal policy's log-probs (off-policy correction); None: ratios against the sampler's."""
    weights_B: Optional[torch.Tensor] = None
    ref_logprobs_BT: Optional[torch.Tensor] = None
    """The reference policy's log-probs, for the KL term and a loss that reads them; None: no KL term."""
    kl_coef: float = 0.0
    """The KL term's coefficient now (it may adapt from step to step); 0 = no KL term."""
    group_B: Optional[torch.Tensor] = None
    """Each row's group, for a loss that pairs a group's rows (``online_dpo``)."""
    values_BT: Optional[torch.Tensor] = None
    """The critic's values (with gradient); None: no value loss."""
    old_values_BT: Optional[torch.Tensor] = None
    returns_BT: Optional[torch.Tensor] = None


def behaviour_weight(prox_BT: torch.Tensor, sampler_BT: torch.Tensor, mask_BT: torch.Tensor,
                     s: ObjectiveSettings) -> tuple[torch.Tensor, dict[str, float]]:
    """The weight per token from ``pi_prox / pi_sampler`` and its metrics: the engine-mismatch
    correction when one is set (``tempering.algorithms.correction``), else the staleness one
    (1 off the mask; truncated at ``is_cap`` for "tis"). The log-ratio is clamped as the losses
    clamp theirs (``importance_ratio``): unclamped, a proximal policy 89 nats above the sampler
    on one token made "decoupled"'s weight inf and the loss inf, or NaN at a zero advantage."""
    if s.mismatch_correction != "none":
        return correct(s.mismatch_correction, prox_BT, sampler_BT, mask_BT, s.mismatch_low, s.mismatch_high)
    weight_BT = importance_ratio((prox_BT - sampler_BT) * mask_BT)
    if s.off_policy == "tis":
        weight_BT = weight_BT.clamp(max=s.is_cap)
    return weight_BT, {"behaviour_weight": masked_mean(weight_BT, mask_BT)}


def objective(x: ObjectiveInputs, s: ObjectiveSettings) -> tuple[torch.Tensor, dict[str, float]]:
    """The scalar loss to differentiate and the metrics of its terms (see the module docstring)."""
    mask_BT = x.mask_BT
    anchor_BT = x.sampler_logprobs_BT if x.prox_logprobs_BT is None else x.prox_logprobs_BT
    loss_BT, metrics = s.loss(LossInputs(
        logprobs_BT=x.logprobs_BT, old_logprobs_BT=anchor_BT, advantages_BT=x.advantages_BT, mask_BT=mask_BT,
        clip_low=s.clip_low, clip_high=s.clip_high, dual_clip=s.dual_clip, ref_logprobs_BT=x.ref_logprobs_BT,
        group_B=x.group_B, beta=s.dpo_beta))
    if x.prox_logprobs_BT is not None:
        behaviour_BT, weighted = behaviour_weight(x.prox_logprobs_BT, x.sampler_logprobs_BT, mask_BT, s)
        loss_BT = loss_BT * behaviour_BT
        metrics.update(weighted)
    if x.weights_B is not None:
        loss_BT = loss_BT * x.weights_B[:, None]
    if s.entropy_coef > 0:
        loss_BT = loss_BT - s.entropy_coef * x.entropy_BT
    if x.ref_logprobs_BT is not None and x.kl_coef > 0:
        kl_BT = kl_estimate(x.logprobs_BT, x.ref_logprobs_BT, s.kl_estimator, s.kl_clamp)
        loss_BT = loss_BT + x.kl_coef * kl_BT
        metrics["kl"] = masked_mean(kl_BT.detach(), mask_BT)
    if x.values_BT is not None:
        value_loss_BT = clipped_value_loss(x.values_BT, x.old_values_BT, x.returns_BT, s.value_clip)
        loss_BT = loss_BT + s.value_coef * value_loss_BT
        metrics["value_loss"] = masked_mean(value_loss_BT.detach(), mask_BT)
    loss = s.aggregation(loss_BT, mask_BT, x.batch_tokens, x.batch_sequences, s.norm_length)
    metrics["loss"] = float(loss.detach())
    metrics["entropy"] = masked_mean(x.entropy_BT.detach(), mask_BT)
    return loss, metrics
