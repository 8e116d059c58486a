"""Offline preference losses (the DPO family): DPO, IPO, SimPO and KTO, as a registry of plain functions.

Every loss works on sequence log-probabilities: a completion's token log-probs summed over
its completion tokens (:func:`sequence_logprobs`), under the policy being trained and, for
all but SimPO, under the frozen reference model. A loss returns one value per example
(``loss_B``) and its implicit rewards; the caller averages ``loss_B`` over the whole batch, so
micro-batches that each add ``loss_B.sum() / batch_size`` give the full batch's gradient.

The formulas are those of TRL 1.x, so that a run here and a run there optimise the same
objective (``tests/unit/test_preference_vs_trl.py`` runs TRL's own code on the same tensors):

- ``dpo``: ``-(1 - eps) log sigmoid(beta d) - eps log sigmoid(-beta d)`` with
  ``d = (logp_c - ref_c) - (logp_r - ref_r)`` (DPO; ``eps`` > 0 is conservative DPO's label
  smoothing, TRL's CPO ``sigmoid`` form, since TRL's DPO ``sigmoid`` has none);
- ``ipo``: ``(d' - 1 / (2 beta))^2`` with each log-ratio of ``d'`` divided by its completion's
  token count (TRL's normalisation, agreed with the IPO authors);
- ``simpo``: ``dpo``'s form on ``d = logp_c / n_c - logp_r / n_r - gamma / beta``: no reference
  model, length-normalised, with a target margin ``gamma`` (TRL's CPO ``simpo``, without CPO's
  extra likelihood term);
- ``kto``: unpaired examples, each desirable or not: ``w_d (1 - sigmoid(beta (r - z)))`` for a
  desirable one, ``w_u (1 - sigmoid(beta (z - r)))`` for an undesirable one, ``r`` its log-ratio
  and ``z`` the KL estimate of :func:`kto_kl` (TRL's ``KTOTrainer``).

Rewards are ``beta`` times the log-ratio (SimPO: ``beta`` times the length-normalised log-prob),
as TRL logs them. Not here: running the model (``tempering.learner.forward``), other TRL loss
types (hinge, robust, ...), which plug in as ``module:function`` with the same signature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from tempering.registry import add


@dataclass
class PairInputs:
    """A batch of ``B`` preference pairs, as sequence log-probs (see :func:`sequence_logprobs`)."""

    chosen_logps_B: torch.Tensor
    """The policy's summed log-prob of each chosen completion (with gradient)."""
    rejected_logps_B: torch.Tensor
    chosen_lengths_B: torch.Tensor
    """Completion tokens of each chosen completion (IPO and SimPO divide by them)."""
    rejected_lengths_B: torch.Tensor
    ref_chosen_logps_B: Optional[torch.Tensor] = None
    """The reference model's; None for a reference-free loss (SimPO)."""
    ref_rejected_logps_B: Optional[torch.Tensor] = None
    beta: float = 0.1
    """How far from the reference the policy may go (IPO: the regulariser tau)."""
    label_smoothing: float = 0.0
    """dpo, simpo: the assumed share of pairs whose labels are flipped; 0 = plain."""
    gamma: float = 0.5
    """simpo: the target reward margin."""


@dataclass
class UnpairedInputs:
    """A batch of ``B`` single completions, each desirable or not (KTO)."""

    logps_B: torch.Tensor
    """The policy's summed log-prob of each completion (with gradient)."""
    ref_logps_B: torch.Tensor
    desirable_B: torch.Tensor
    """True for a desirable completion, False for an undesirable one."""
    kl: torch.Tensor
    """The batch's KL estimate, a constant (:func:`kto_kl`)."""
    beta: float = 0.1
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0


Rewards = dict[str, torch.Tensor]
"""``rewards/chosen`` and ``rewards/rejected``: detached implicit rewards, one per chosen
(desirable) and rejected (undesirable) completion."""
PreferenceLoss = Callable[..., tuple[torch.Tensor, Rewards]]
PREFERENCE_LOSSES: dict[str, PreferenceLoss] = {}


def register_preference_loss(name: str, paired: bool = True, reference: bool = True
                             ) -> Callable[[PreferenceLoss], PreferenceLoss]:
    """Register a loss. ``paired``: it takes :class:`PairInputs` (else :class:`UnpairedInputs`);
    ``reference``: it needs the reference model's log-probs (else they are never computed)."""
    return lambda fn: add(PREFERENCE_LOSSES, "preference loss", name, fn, paired=paired, reference=reference)


def sequence_logprobs(logprobs_BT: torch.Tensor, mask_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(summed log-probs, token counts)`` of each row's completion tokens (``mask_BT`` nonzero).

    >>> sequence_logprobs(torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, 0.0]]), torch.tensor([[0, 1, 1], [0, 1, 0]]))
    (tensor([-3.0000, -0.5000]), tensor([2, 1]))
    """
    return (logprobs_BT * mask_BT).sum(-1), mask_BT.sum(-1)


def _smoothed_sigmoid(logits_B: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    """``-(1 - eps) log sigmoid(beta x) - eps log sigmoid(-beta x)``: the logistic loss with labels
    flipped with probability ``eps``."""
    return (-(1 - label_smoothing) * F.logsigmoid(beta * logits_B)
            - label_smoothing * F.logsigmoid(-beta * logits_B))


def _log_ratios(inputs: PairInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return inputs.chosen_logps_B - inputs.ref_chosen_logps_B, inputs.rejected_logps_B - inputs.ref_rejected_logps_B


def _rewards(chosen_B: torch.Tensor, rejected_B: torch.Tensor, beta: float) -> Rewards:
    return {"rewards/chosen": beta * chosen_B.detach(), "rewards/rejected": beta * rejected_B.detach()}


@register_preference_loss("dpo")
def dpo(inputs: PairInputs) -> tuple[torch.Tensor, Rewards]:
    """DPO: the logistic loss on ``beta`` times the chosen log-ratio minus the rejected one."""
    chosen_B, rejected_B = _log_ratios(inputs)
    return _smoothed_sigmoid(chosen_B - rejected_B, inputs.beta, inputs.label_smoothing), \
        _rewards(chosen_B, rejected_B, inputs.beta)


@register_preference_loss("ipo")
def ipo(inputs: PairInputs) -> tuple[torch.Tensor, Rewards]:
    """IPO: the squared distance of the per-token log-ratio difference from ``1 / (2 beta)``.
    Unlike DPO's, it stops pulling once the margin is reached, so it does not drive the
    rejected completion's probability towards 0."""
    chosen_B, rejected_B = _log_ratios(inputs)
    margin_B = chosen_B / inputs.chosen_lengths_B.clamp(min=1) - rejected_B / inputs.rejected_lengths_B.clamp(min=1)
    return (margin_B - 1 / (2 * inputs.beta)) ** 2, _rewards(chosen_B, rejected_B, inputs.beta)


@register_preference_loss("simpo", reference=False)
def simpo(inputs: PairInputs) -> tuple[torch.Tensor, Rewards]:
    """SimPO: the logistic loss on the difference of length-normalised log-probs, less a
    target margin ``gamma``; no reference model."""
    chosen_B = inputs.chosen_logps_B / inputs.chosen_lengths_B.clamp(min=1)
    rejected_B = inputs.rejected_logps_B / inputs.rejected_lengths_B.clamp(min=1)
    logits_B = chosen_B - rejected_B - inputs.gamma / inputs.beta
    return _smoothed_sigmoid(logits_B, inputs.beta, inputs.label_smoothing), _rewards(chosen_B, rejected_B, inputs.beta)


def kto_kl(kl_logps_B: torch.Tensor, ref_kl_logps_B: torch.Tensor) -> torch.Tensor:
    """KTO's reference point: the mean log-ratio of mismatched completions (each prompt with
    another example's completion), at least 0 and without gradient, as TRL estimates it.

    >>> kto_kl(torch.tensor([-3.0, -1.0]), torch.tensor([-2.0, -1.5])).item()
    0.0
    """
    return (kl_logps_B - ref_kl_logps_B).mean().detach().clamp(min=0)


@register_preference_loss("kto", paired=False)
def kto(inputs: UnpairedInputs) -> tuple[torch.Tensor, Rewards]:
    """KTO: a desirable completion is pulled until its log-ratio is well above the KL reference
    point, an undesirable one pushed until well below it, each weighted by its kind's weight."""
    ratio_B = inputs.logps_B - inputs.ref_logps_B
    desirable_B = inputs.desirable_B.bool()
    gain_B = torch.where(desirable_B, ratio_B - inputs.kl, inputs.kl - ratio_B)
    weight_B = torch.where(desirable_B, inputs.desirable_weight, inputs.undesirable_weight).to(ratio_B.dtype)
    rewards = {"rewards/chosen": inputs.beta * ratio_B[desirable_B].detach(),
               "rewards/rejected": inputs.beta * ratio_B[~desirable_B].detach()}
    return weight_B * (1 - torch.sigmoid(inputs.beta * gain_B)), rewards
