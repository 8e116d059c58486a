"""Advantage estimators: ``fn(AdvantageInputs) -> advantages_BT``.

Every estimator returns a per-token advantage aligned with ``mask_BT`` and zero where the
mask is zero, so outcome-level estimators (one number per rollout) and token-level ones
(REINFORCE++, GAE) share one interface.

A KL penalty folded into the reward arrives as ``penalty_BT`` (already multiplied by its
coefficient). Outcome estimators subtract its sum from each rollout's reward
(:func:`sequence_rewards`); token-level ones subtract it token by token
(:func:`token_rewards`).

An estimator that needs a critic says so with ``needs_values = True`` on the function
(``register_advantage(name, needs_values=True)``); the loop then builds a value model and
fills ``values_BT``. One that needs a teacher model says ``needs_teacher=True``; the loop then
loads ``algorithm.teacher`` and fills ``teacher_logprobs_BT`` beside the sampler's
``logprobs_BT``. Estimators take their hyper-parameters from the inputs, so every entry has
the same signature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from tempering.registry import add


@dataclass
class AdvantageInputs:
    rewards_B: torch.Tensor
    """Scalar reward of each rollout."""
    group_B: torch.Tensor
    """Index of each rollout's group (its problem); rollouts of one group are compared."""
    mask_BT: torch.Tensor
    """1 on trained completion tokens."""
    values_BT: Optional[torch.Tensor] = None
    """Critic estimates V(state before token t), for estimators that use a critic."""
    penalty_BT: Optional[torch.Tensor] = None
    """Per-token penalty subtracted from the reward (a KL to the reference, times its coefficient)."""
    gamma: float = 1.0
    """Discount per token (REINFORCE++, GAE)."""
    lam: float = 1.0
    """GAE's lambda: 1 gives Monte-Carlo returns minus values, 0 one-step TD errors."""
    eps: float = 1e-6
    """Added to standard deviations before dividing, so flat groups give 0, not NaN."""
    domain_B: Optional[torch.Tensor] = None
    """Index of each rollout's domain (task), for estimators that normalise within a domain."""
    logprobs_BT: Optional[torch.Tensor] = None
    """The sampler's log-probs of the sampled tokens (the student's, in distillation)."""
    teacher_logprobs_BT: Optional[torch.Tensor] = None
    """A teacher model's log-probs of the same tokens, for estimators that need a teacher."""
    task_weight: float = 0.0
    """Distillation: weight of the task reward's GRPO advantage added to the teacher's signal."""


AdvantageFn = Callable[[AdvantageInputs], torch.Tensor]
ADVANTAGES: dict[str, AdvantageFn] = {}


def register_advantage(name: str, needs_values: bool = False,
                       needs_teacher: bool = False) -> Callable[[AdvantageFn], AdvantageFn]:
    return lambda fn: add(ADVANTAGES, "advantage estimator", name, fn, needs_values=needs_values,
                          needs_teacher=needs_teacher)


def needs_values(estimator: AdvantageFn) -> bool:
    """Whether the estimator reads ``values_BT`` (so a critic must be built)."""
    return bool(getattr(estimator, "needs_values", False))


def needs_teacher(estimator: AdvantageFn) -> bool:
    """Whether the estimator reads ``teacher_logprobs_BT`` (so a teacher model must be loaded)."""
    return bool(getattr(estimator, "needs_teacher", False))


def group_statistics(rewards_B: torch.Tensor, group_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-rollout mean and unbiased standard deviation of its group's rewards, in the rewards'
    dtype and on their device.

    A group of one has standard deviation 0. A group whose rewards are all equal has exactly
    that reward as its mean (a float sum divided by the count may miss it by a rounding
    error), so its centred rewards are exactly 0 and the learner can skip its rows.

    >>> mean_B, std_B = group_statistics(torch.full((3,), 0.1), torch.zeros(3, dtype=torch.long))
    >>> bool((torch.full((3,), 0.1) - mean_B == 0).all()), float(std_B[0])
    (True, 0.0)
    """
    groups = int(group_B.max().item()) + 1
    count_G = rewards_B.new_zeros(groups).index_add_(0, group_B, torch.ones_like(rewards_B))
    mean_G = rewards_B.new_zeros(groups).index_add_(0, group_B, rewards_B) / count_G
    low_G = rewards_B.new_full((groups,), float("inf")).scatter_reduce(0, group_B, rewards_B, "amin")
    high_G = rewards_B.new_full((groups,), float("-inf")).scatter_reduce(0, group_B, rewards_B, "amax")
    mean_G = torch.where(low_G == high_G, low_G, mean_G)
    centred_B = rewards_B - mean_G[group_B]
    square_G = rewards_B.new_zeros(groups).index_add_(0, group_B, centred_B**2)
    std_G = (square_G / (count_G - 1).clamp(min=1)).sqrt()
    return mean_G[group_B], std_G[group_B]


def float_rewards(inputs: AdvantageInputs) -> torch.Tensor:
    """The rewards as floating point: their own dtype when they have one (float64 stays
    float64), else float32."""
    rewards_B = inputs.rewards_B
    return rewards_B if rewards_B.is_floating_point() else rewards_B.float()


def sequence_rewards(inputs: AdvantageInputs) -> torch.Tensor:
    """Each rollout's reward minus the sum of its per-token penalty over trained tokens."""
    rewards_B = float_rewards(inputs)
    if inputs.penalty_BT is None:
        return rewards_B
    return rewards_B - (inputs.penalty_BT * inputs.mask_BT).sum(-1)


def token_rewards(inputs: AdvantageInputs) -> torch.Tensor:
    """The outcome reward on each row's last trained token, minus the per-token penalty.

    A row with no trained token gets no reward (its advantages are masked anyway).
    """
    mask_BT, rewards_B = inputs.mask_BT, float_rewards(inputs)
    positions_BT = torch.arange(mask_BT.shape[1], device=mask_BT.device).expand_as(mask_BT)
    last_B = torch.where(mask_BT > 0, positions_BT, -1).max(-1).values
    rewards_BT = rewards_B.new_zeros(mask_BT.shape)
    rows_B = torch.nonzero(last_B >= 0)[:, 0]
    rewards_BT[rows_B, last_B[rows_B]] = rewards_B[rows_B]
    if inputs.penalty_BT is not None:
        rewards_BT = rewards_BT - inputs.penalty_BT * mask_BT
    return rewards_BT


def discounted_returns(rewards_BT: torch.Tensor, mask_BT: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma * G_next`` over each row's trained tokens, skipping masked ones."""
    returns_BT = torch.zeros_like(rewards_BT)
    running_B = rewards_BT.new_zeros(rewards_BT.shape[0])
    for t in reversed(range(rewards_BT.shape[1])):
        on_B = mask_BT[:, t] > 0
        running_B = torch.where(on_B, rewards_BT[:, t] + gamma * running_B, running_B)
        returns_BT[:, t] = running_B * on_B
    return returns_BT


def whiten(values_BT: torch.Tensor, mask_BT: torch.Tensor, eps: float) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` with mean and unbiased std over the masked tokens of the batch."""
    count = mask_BT.sum()
    mean = (values_BT * mask_BT).sum() / count.clamp(min=1)
    variance = (((values_BT - mean) * mask_BT) ** 2).sum() / (count - 1).clamp(min=1)
    return (values_BT - mean) / (variance.sqrt() + eps) * mask_BT


@register_advantage("grpo")
def grpo(inputs: AdvantageInputs) -> torch.Tensor:
    """GRPO: reward minus its group's mean, divided by the group's std (+eps), on every token.

    Groups whose rewards are all equal get advantage 0: they carry no signal.
    """
    rewards_B = sequence_rewards(inputs)
    mean_B, std_B = group_statistics(rewards_B, inputs.group_B)
    advantage_B = (rewards_B - mean_B) / (std_B + inputs.eps)
    return advantage_B[:, None] * inputs.mask_BT


def turn_index(mask_BT: torch.Tensor) -> torch.Tensor:
    """Which model turn of its row each token is in (0 for the first): a turn is a run of
    trained tokens, and the environment's observations between turns are untrained.

    >>> turn_index(torch.tensor([[0., 1., 1., 0., 1., 0., 0., 1.]]))
    tensor([[0, 0, 0, 0, 1, 1, 1, 2]])
    """
    trained_BT = mask_BT > 0
    before_BT = torch.nn.functional.pad(trained_BT[:, :-1], (1, 0))
    starts_BT = trained_BT & ~before_BT
    return (starts_BT.long().cumsum(-1) - 1).clamp(min=0)


@register_advantage("grpo_turns")
def grpo_turns(inputs: AdvantageInputs) -> torch.Tensor:
    """GRPO with a baseline per turn: a token of turn t gets its episode's reward minus the mean
    of the group's episodes that reached turn t, divided by their std (+eps).

    In an environment that answers a failed attempt (``reflection``), only episodes whose
    earlier attempts failed reach a later one, so the whole group's mean (``grpo``) is above
    what a later attempt can expect, and every later attempt, fixed or not, is pushed down
    with its format. Against the episodes that reached the same turn, a retry that fixes is
    pushed up and one that does not is pushed down. One-turn rollouts get ``grpo``'s
    advantages.

    >>> mask_BT = torch.tensor([[1., 0., 0.], [1., 0., 1.], [1., 0., 1.]])
    >>> grpo_turns(AdvantageInputs(torch.tensor([1., 1., 0.]), torch.zeros(3, dtype=torch.long), mask_BT))
    tensor([[ 0.5773,  0.0000,  0.0000],
            [ 0.5773,  0.0000,  0.7071],
            [-1.1547,  0.0000, -0.7071]])
    """
    rewards_B, mask_BT = sequence_rewards(inputs), inputs.mask_BT
    turn_BT = turn_index(mask_BT)
    advantages_BT = torch.zeros_like(mask_BT, dtype=rewards_B.dtype)
    for turn in range(int(turn_BT.max().item()) + 1 if mask_BT.numel() else 0):
        in_turn_BT = (turn_BT == turn) & (mask_BT > 0)
        reached_B = in_turn_BT.any(-1)
        if not reached_B.any():
            continue
        rewards_R = rewards_B[reached_B]
        mean_R, std_R = group_statistics(rewards_R, inputs.group_B[reached_B])
        advantage_B = torch.zeros_like(rewards_B)
        advantage_B[reached_B] = (rewards_R - mean_R) / (std_R + inputs.eps)
        advantages_BT = advantages_BT + advantage_B[:, None] * in_turn_BT
    return advantages_BT * mask_BT


@register_advantage("dr_grpo")
def dr_grpo(inputs: AdvantageInputs) -> torch.Tensor:
    """Dr. GRPO: reward minus its group's mean, not divided by the std.

    Dividing by the std up-weights groups that are almost all right or all wrong; Dr. GRPO
    drops it. Its other half, no division by each sequence's length, is the aggregation
    ``token_sum_norm``, chosen separately.
    """
    rewards_B = sequence_rewards(inputs)
    mean_B, _ = group_statistics(rewards_B, inputs.group_B)
    return (rewards_B - mean_B)[:, None] * inputs.mask_BT


@register_advantage("rloo")
def rloo(inputs: AdvantageInputs) -> torch.Tensor:
    """RLOO: reward minus the mean of the *other* rollouts of its group.

    Equal to ``n / (n - 1) * (r - group mean)`` for a group of n; the baseline does not
    depend on the rollout itself, so the estimate is unbiased. A group of one gets 0.
    """
    rewards_B = sequence_rewards(inputs)
    mean_B, _ = group_statistics(rewards_B, inputs.group_B)
    count_B = torch.bincount(inputs.group_B).to(rewards_B.dtype)[inputs.group_B]
    advantage_B = (rewards_B - mean_B) * count_B / (count_B - 1).clamp(min=1)
    return advantage_B[:, None] * inputs.mask_BT


@register_advantage("reinforce_pp")
def reinforce_pp(inputs: AdvantageInputs) -> torch.Tensor:
    """REINFORCE++: discounted per-token returns, whitened over all trained tokens of the batch.

    No group baseline: the batch-wide mean is the baseline, so it works with groups of one.
    Longer sequences contribute more tokens to the mean and std.
    """
    returns_BT = discounted_returns(token_rewards(inputs), inputs.mask_BT, inputs.gamma)
    return whiten(returns_BT, inputs.mask_BT, inputs.eps)


@register_advantage("reinforce_pp_baseline")
def reinforce_pp_baseline(inputs: AdvantageInputs) -> torch.Tensor:
    """REINFORCE++ with a group baseline: reward minus its group's mean, then whitened over
    all trained tokens of the batch (the batch std, not each group's, sets the scale)."""
    rewards_B = sequence_rewards(inputs)
    mean_B, _ = group_statistics(rewards_B, inputs.group_B)
    return whiten((rewards_B - mean_B)[:, None] * inputs.mask_BT, inputs.mask_BT, inputs.eps)


@register_advantage("gae", needs_values=True)
def gae(inputs: AdvantageInputs) -> torch.Tensor:
    """PPO's generalised advantage estimation over each row's trained tokens.

    ``delta_t = r_t + gamma * V_next - V_t`` and ``A_t = delta_t + gamma * lam * A_next``,
    where "next" is the row's next trained token and the value after the last one is 0.
    The reward sits on the last trained token (see :func:`token_rewards`).

    The advantages are not whitened: ``advantages + values`` are then the value targets.
    """
    if inputs.values_BT is None:
        raise ValueError("gae needs values_BT from a critic")
    rewards_BT, values_BT, mask_BT = token_rewards(inputs), inputs.values_BT, inputs.mask_BT
    advantages_BT = torch.zeros_like(rewards_BT)
    next_value_B = rewards_BT.new_zeros(rewards_BT.shape[0])
    next_advantage_B = rewards_BT.new_zeros(rewards_BT.shape[0])
    for t in reversed(range(rewards_BT.shape[1])):
        on_B = mask_BT[:, t] > 0
        delta_B = rewards_BT[:, t] + inputs.gamma * next_value_B - values_BT[:, t]
        advantage_B = delta_B + inputs.gamma * inputs.lam * next_advantage_B
        advantages_BT[:, t] = advantage_B * on_B
        next_value_B = torch.where(on_B, values_BT[:, t], next_value_B)
        next_advantage_B = torch.where(on_B, advantage_B, next_advantage_B)
    return advantages_BT


@register_advantage("grpo_domain")
def grpo_domain(inputs: AdvantageInputs) -> torch.Tensor:
    """Reward minus its group's mean, divided by the std of those differences over its domain.

    GRPO divides by each group's own std, so a nearly solved group's small differences are
    blown up to unit scale; dividing per domain keeps each domain's advantages at unit scale
    (a domain with rewards in [0, 10] does not outweigh one in [0, 1]) while groups within a
    domain keep their relative sizes. Without ``domain_B`` the batch is one domain.

    >>> inputs = AdvantageInputs(torch.tensor([0., 1., 0., 10.]), torch.tensor([0, 0, 1, 1]),
    ...                          torch.ones(4, 1), domain_B=torch.tensor([0, 0, 1, 1]))
    >>> grpo_domain(inputs)[:, 0]
    tensor([-0.7071,  0.7071, -0.7071,  0.7071])
    """
    rewards_B = sequence_rewards(inputs)
    mean_B, _ = group_statistics(rewards_B, inputs.group_B)
    centred_B = rewards_B - mean_B
    domain_B = inputs.domain_B if inputs.domain_B is not None else torch.zeros_like(inputs.group_B)
    _, spread_B = group_statistics(centred_B, domain_B)
    return (centred_B / (spread_B + inputs.eps))[:, None] * inputs.mask_BT


@register_advantage("distill", needs_teacher=True)
def distill(inputs: AdvantageInputs) -> torch.Tensor:
    """On-policy distillation: each sampled token's advantage is ``log p_teacher - log p_student``
    (minus the k1 estimate of the reverse KL(student || teacher) at that token), plus
    ``task_weight`` times GRPO's advantage of the task reward.

    The student's log-prob is the sampler's, so the samples are the student's own (on-policy)
    and no extra forward pass is needed. Each token is judged by the teacher on its own, with
    no baseline and no sum over later tokens (a discount of 0): the teacher's log-prob already
    says how good the token is where it stands. A student equal to its teacher gets 0.

    >>> inputs = AdvantageInputs(torch.zeros(2), torch.zeros(2, dtype=torch.long),
    ...                          torch.tensor([[1., 1.], [1., 0.]]),
    ...                          logprobs_BT=torch.tensor([[-0.1, -2.0], [-1.0, -5.0]]),
    ...                          teacher_logprobs_BT=torch.tensor([[-0.1, -0.5], [-3.0, 0.0]]))
    >>> distill(inputs)
    tensor([[ 0.0000,  1.5000],
            [-2.0000,  0.0000]])
    """
    if inputs.logprobs_BT is None or inputs.teacher_logprobs_BT is None:
        raise ValueError("distill needs logprobs_BT and teacher_logprobs_BT")
    advantages_BT = (inputs.teacher_logprobs_BT - inputs.logprobs_BT) * inputs.mask_BT
    if inputs.task_weight:
        advantages_BT = advantages_BT + inputs.task_weight * grpo(inputs)
    return advantages_BT
