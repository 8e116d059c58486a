"""KL estimators between the policy and a reference, per token, from sampled tokens' log-probs.

With ``delta = ref - logp`` (log of the ratio reference/policy at the sampled token):

- ``k1 = -delta``: unbiased, high variance, can be negative;
- ``k2 = delta**2 / 2``: low variance, biased;
- ``k3 = exp(delta) - delta - 1``: unbiased and non-negative (Schulman's estimator).
"""

from __future__ import annotations

from typing import Callable

import torch

KL_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": lambda delta: -delta,
    "k2": lambda delta: 0.5 * delta**2,
    "k3": lambda delta: torch.exp(delta) - delta - 1,
}


def kl_estimate(logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL(policy || reference) estimate.

    >>> kl_estimate(torch.tensor([0.0]), torch.tensor([0.0])).item()
    0.0
    """
    return KL_ESTIMATORS[estimator](ref_logprobs_BT - logprobs_BT)
