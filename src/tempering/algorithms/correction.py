"""Correction for a sampler that is not the learner: truncated and masked importance sampling.

vLLM, an inference server or bf16 sampling compute the policy with other kernels than the
learner, so the tokens were drawn from ``pi_sampler``, not quite the learner's ``pi``. With
``w_t = pi_prox(y_t) / pi_sampler(y_t)``, ``pi_prox`` the learner's weights at the start of
the step (detached: a weight on the loss, not part of what is differentiated), each variant
turns ``w`` into a weight per token that multiplies its policy loss:

- ``tis``: truncated importance sampling, ``min(w_t, high)``: the sampler's bias is corrected
  where it under-weights a token, and no token is weighted more than ``high``;
- ``mis_token``: masked importance sampling, ``w_t`` where ``low <= w_t <= high`` and 0 for the
  tokens outside that band (the engines disagree too much there to trust the token at all);
- ``mis_sequence``: the same by whole sequences, with the sequence's ratio
  ``rho = prod_t w_t = pi_prox(y) / pi_sampler(y)``: a sequence inside the band weighs
  ``rho`` on every token, one outside it 0.

A masked token still counts in the loss's normaliser (its weight is 0, the aggregation's
token and sequence counts are the batch's), so a step that masks many tokens moves less. Each
ratio is ``exp`` of a log-ratio clamped as the losses clamp theirs
(``losses.importance_ratio``), so a long sequence or a token the engines disagree on wildly is
masked with a finite weight rather than turning the loss into NaN. Each
variant also says what it did: ``mismatch/is_weight`` (the mean weight applied),
``mismatch/truncated`` (tokens whose weight was cut to ``high``) and ``mismatch/masked``
(tokens given weight 0). Selected by ``pipeline.mismatch_correction``; the learner applies it
to every batch, stale or fresh.
"""

from __future__ import annotations

from typing import Callable

import torch

from tempering.algorithms.losses import importance_ratio

Correction = Callable[[torch.Tensor, torch.Tensor, float, float], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
"""``(log_w_BT, mask_BT, low, high) -> (weight_BT, truncated_BT, masked_BT)``, the last two 0/1."""


def truncated(log_w_BT: torch.Tensor, mask_BT: torch.Tensor, low: float, high: float):
    """Token-level truncated importance sampling.

    >>> weight, cut, masked = truncated(torch.log(torch.tensor([[0.5, 1.0, 3.0]])), torch.ones(1, 3), 0.5, 2.0)
    >>> weight.round(decimals=4).tolist(), cut.tolist(), masked.tolist()
    ([[0.5, 1.0, 2.0]], [[0.0, 0.0, 1.0]], [[0.0, 0.0, 0.0]])
    """
    w_BT = importance_ratio(log_w_BT)
    return w_BT.clamp(max=high) * mask_BT, (w_BT > high).float() * mask_BT, torch.zeros_like(w_BT)


def masked_tokens(log_w_BT: torch.Tensor, mask_BT: torch.Tensor, low: float, high: float):
    """Token-level masked importance sampling.

    >>> weight, _, masked = masked_tokens(torch.log(torch.tensor([[0.25, 1.5, 3.0]])), torch.ones(1, 3), 0.5, 2.0)
    >>> weight.round(decimals=4).tolist(), masked.tolist()
    ([[0.0, 1.5, 0.0]], [[1.0, 0.0, 1.0]])
    """
    w_BT = importance_ratio(log_w_BT)
    keep_BT = (w_BT >= low) & (w_BT <= high)
    return w_BT * keep_BT * mask_BT, torch.zeros_like(w_BT), (~keep_BT).float() * mask_BT


def masked_sequences(log_w_BT: torch.Tensor, mask_BT: torch.Tensor, low: float, high: float):
    """Sequence-level masked importance sampling, by each row's product of token ratios.

    >>> log_w = torch.log(torch.tensor([[2.0, 0.75], [2.0, 1.5]]))  # rho = 1.5 and 3.0
    >>> weight, _, masked = masked_sequences(log_w, torch.ones(2, 2), 0.5, 2.0)
    >>> weight.round(decimals=4).tolist(), masked.tolist()
    ([[1.5, 1.5], [0.0, 0.0]], [[0.0, 0.0], [1.0, 1.0]])
    """
    rho_B = importance_ratio((log_w_BT * mask_BT).sum(dim=-1))
    keep_B = (rho_B >= low) & (rho_B <= high)
    weight_BT = (rho_B * keep_B)[:, None] * mask_BT
    return weight_BT, torch.zeros_like(weight_BT), (~keep_B).float()[:, None] * mask_BT


CORRECTIONS: dict[str, Correction] = {"tis": truncated, "mis_token": masked_tokens, "mis_sequence": masked_sequences}


def correct(name: str, prox_BT: torch.Tensor, sampler_BT: torch.Tensor, mask_BT: torch.Tensor, low: float,
            high: float) -> tuple[torch.Tensor, dict[str, float]]:
    """The weight per token of correction ``name`` and the metrics saying what it did."""
    weight_BT, cut_BT, masked_BT = CORRECTIONS[name]((prox_BT - sampler_BT) * mask_BT, mask_BT, low, high)
    shares = (torch.stack([weight_BT.sum(), cut_BT.sum(), masked_BT.sum()]) / mask_BT.sum().clamp(min=1)).tolist()
    return weight_BT, dict(zip(("mismatch/is_weight", "mismatch/truncated", "mismatch/masked"), shares))
