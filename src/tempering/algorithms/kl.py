"""KL estimators between the policy and a reference, per token, from sampled tokens' log-probs.

With ``delta = ref - logp`` (log of the ratio reference/policy at the sampled token):

- ``k1 = -delta``: unbiased, high variance, can be negative;
- ``k2 = delta**2 / 2``: low variance, biased;
- ``k3 = exp(delta) - delta - 1``: unbiased and non-negative (Schulman's estimator);
- ``abs = |delta|``: non-negative, biased;
- ``k1+`` and ``k3+``: the value of k1 or k3 with the gradient of k2, written
  ``k2 - sg(k2) + sg(kx)``. k1 and k3 estimate the KL's value without bias but not its
  gradient; k2's gradient ``-delta * grad(logp)`` is the KL's own in expectation over the
  policy's samples, so as a loss term these give an unbiased gradient and report the value.

k3's ``exp`` sees ``delta`` clamped to ``±LOG_RATIO_LIMIT`` (the losses' bound), so a token
the policy has moved far from the reference gives a large, finite value and no gradient
instead of inf. ``clamp > 0`` also bounds every estimator's value to ``[-clamp, clamp]``
(verl bounds k3 by 10): a plain estimator gives no gradient where its value is clamped, a
straight-through one keeps k2's gradient.
"""

from __future__ import annotations

from typing import Callable

import torch

from tempering.algorithms.losses import LOG_RATIO_LIMIT


def _k3(delta: torch.Tensor) -> torch.Tensor:
    delta = delta.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return torch.exp(delta) - delta - 1


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": lambda delta: -delta,
    "k2": lambda delta: 0.5 * delta**2,
    "k3": _k3,
    "abs": torch.abs,
}
"""The value estimators; a name with a trailing ``+`` takes its value and k2's gradient."""


def kl_estimate(logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor, estimator: str = "k3",
                clamp: float = 0.0) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate; ``clamp > 0`` bounds its value (see the module docstring).

    >>> kl_estimate(torch.tensor([0.0]), torch.tensor([0.0])).item()
    0.0
    >>> kl_estimate(torch.tensor([-1.0]), torch.tensor([-3.0]), "k3+", clamp=1.0).item()
    1.0
    """
    delta_BT = ref_logprobs_BT - logprobs_BT
    straight_through = estimator.endswith("+")
    value_BT = KL_ESTIMATORS[estimator.removesuffix("+")](delta_BT)
    if clamp > 0:
        value_BT = value_BT.clamp(-clamp, clamp)
    if not straight_through:
        return value_BT
    k2_BT = KL_ESTIMATORS["k2"](delta_BT)
    return k2_BT - k2_BT.detach() + value_BT.detach()


class KLCoefficient:
    """The KL coefficient: fixed, or adapted towards a target KL (Ziegler et al., 2019).

    With ``target > 0``, after each step that measured ``kl`` (mean per token) the
    coefficient is multiplied by ``1 + clip(kl / target - 1, -0.2, 0.2) / horizon``: it grows
    while the policy drifts further than the target and shrinks while it stays closer.
    ``target = 0`` keeps the coefficient fixed.

    >>> c = KLCoefficient(0.1, target=0.01, horizon=10)
    >>> c.update(0.05); round(c.value, 6)  # error clipped to 0.2: 0.1 * 1.02
    0.102
    """

    def __init__(self, initial: float, target: float = 0.0, horizon: int = 10000):
        self.value = initial
        self.target = target
        self.horizon = horizon

    def update(self, kl: float) -> None:
        if self.target > 0:
            error = min(max(kl / self.target - 1.0, -0.2), 0.2)
            self.value *= 1.0 + error / self.horizon


MISMATCH_KEYS = ("mismatch/abs_logp", "mismatch/k3", "mismatch/outside_clip")


def mismatch(logprobs_BT: torch.Tensor, sampler_logprobs_BT: torch.Tensor, mask_BT: torch.Tensor,
             clip_low: float, clip_high: float) -> dict[str, float]:
    """How far the learner's log-probs of the sampled tokens are from the sampler's, over
    ``mask_BT``: the mean ``|delta|``, the k3 estimate of KL(sampler || learner) and the share
    of tokens whose ratio ``exp(delta)`` is outside ``[1 - clip_low, 1 + clip_high]``, with
    ``delta = learner - sampler``. Measured before a step's first update, these are the
    disagreement of two implementations of one policy (bf16, kernels, a server's engine).

    >>> found = mismatch(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.0, -1.5]]), torch.ones(1, 2), 0.2, 0.2)
    >>> {key: round(value, 4) for key, value in found.items()}  # k3: (exp(-0.5) + 0.5 - 1) / 2
    {'mismatch/abs_logp': 0.25, 'mismatch/k3': 0.0533, 'mismatch/outside_clip': 0.5}
    """
    delta_BT = (logprobs_BT - sampler_logprobs_BT) * mask_BT
    count = mask_BT.sum().clamp(min=1)
    ratio_BT = delta_BT.exp()
    outside_BT = (ratio_BT < 1 - clip_low) | (ratio_BT > 1 + clip_high)
    return dict(zip(MISMATCH_KEYS, (
        float((delta_BT.abs() * mask_BT).sum() / count),
        float((kl_estimate(sampler_logprobs_BT, logprobs_BT, "k3") * mask_BT).sum() / count),
        float((outside_BT.float() * mask_BT).sum() / count))))
