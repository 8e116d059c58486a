"""Advantage estimators: ``fn(AdvantageInputs) -> advantages_BT``.

Every estimator returns a per-token advantage aligned with ``mask_BT`` and zero where the
mask is zero, so outcome-level estimators (one number per rollout) and token-level ones
(GAE) share one interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch


@dataclass
class AdvantageInputs:
    rewards_B: torch.Tensor
    """Scalar reward of each rollout."""
    group_B: torch.Tensor
    """Index of each rollout's group (its problem); rollouts of one group are compared."""
    mask_BT: torch.Tensor
    """1 on trained completion tokens."""
    values_BT: Optional[torch.Tensor] = None
    """Value-head estimates, for estimators that use a critic."""


AdvantageFn = Callable[[AdvantageInputs], torch.Tensor]
ADVANTAGES: dict[str, AdvantageFn] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    def decorator(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGES:
            raise ValueError(f"advantage estimator {name!r} is registered twice")
        ADVANTAGES[name] = fn
        return fn

    return decorator


def group_statistics(rewards_B: torch.Tensor, group_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-rollout mean and unbiased standard deviation of its group's rewards.

    A group of one has standard deviation 0.
    """
    groups = int(group_B.max().item()) + 1
    count_G = torch.zeros(groups).index_add_(0, group_B, torch.ones_like(rewards_B))
    mean_G = torch.zeros(groups).index_add_(0, group_B, rewards_B) / count_G
    centred_B = rewards_B - mean_G[group_B]
    square_G = torch.zeros(groups).index_add_(0, group_B, centred_B**2)
    std_G = (square_G / (count_G - 1).clamp(min=1)).sqrt()
    return mean_G[group_B], std_G[group_B]


@register_advantage("grpo")
def grpo(inputs: AdvantageInputs, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: reward minus its group's mean, divided by the group's std (+eps), on every token.

    Groups whose rewards are all equal get advantage 0: they carry no signal.
    """
    mean_B, std_B = group_statistics(inputs.rewards_B.float(), inputs.group_B)
    advantage_B = (inputs.rewards_B - mean_B) / (std_B + eps)
    return advantage_B[:, None] * inputs.mask_BT
