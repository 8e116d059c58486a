"""Online preference optimisation: DPO on pairs built during RL from each group's rollouts.

Each group of rollouts of one problem gives at most one pair: its best rollout by the task's
reward (chosen) and its worst (rejected), the first of each in the group's order when several
tie; a group whose rewards are all equal gives none. The estimator ``best_worst`` marks them in
the advantages (+1 on the chosen rollout's trained tokens, -1 on the rejected one's, 0 on every
other rollout), and the loss ``online_dpo`` pairs the two rows of a group (``LossInputs.group_B``)
and applies the DPO loss of ``tempering.algorithms.preference`` (``PREFERENCE_LOSSES["dpo"]``) to
their summed log-probs under the policy and under the reference.

The reference is the frozen initial policy (the learner holds it, as for a KL term, and
checkpoints carry it). The sampler's log-probs would cost nothing, but they move with the
policy: at each step's first update the policy *is* the sampler, every margin is 0, and the
loss degenerates to a fixed push of ``beta / 2`` up on the chosen and down on the rejected
completion, with nothing holding the policy near where it started; against the initial policy
the margin grows as the pairs are learned, so the loss saturates on learned pairs and its
accuracy and margin metrics say how far the policy has moved.

Each pair's loss is spread evenly over its two rows' trained tokens (each token carries
``loss / (n_chosen + n_rejected)``), so the pair's tokens sum to its loss and the configured
aggregation turns pairs into one number: ``seq_mean_token_sum`` gives the sum of the pair losses
over the batch's rollouts, ``token_mean`` the same over its trained tokens. The learner keeps a
group's rows in one micro-batch (``paired`` below), so micro-batching does not change the loss.

Not here: pairs judged by a reward model other than the task's reward (a reward model
configured as the task's reward is one), more than one pair per group, other losses of the
DPO family online (they plug in as ``module:function`` with this signature).
"""

from __future__ import annotations

import torch

from tempering.algorithms.advantages import AdvantageInputs, register_advantage, sequence_rewards
from tempering.algorithms.losses import LossInputs, register_loss
from tempering.algorithms.preference import PREFERENCE_LOSSES, PairInputs, sequence_logprobs


def best_and_worst(rewards_B: torch.Tensor, group_B: torch.Tensor) -> torch.Tensor:
    """+1 for each group's best rollout, -1 for its worst, 0 otherwise and for groups whose
    rewards are all equal; the first in order wins a tie.

    >>> best_and_worst(torch.tensor([0.0, 1.0, 1.0, 0.5, 0.5, 2.0, 0.0]), torch.tensor([0, 0, 0, 1, 1, 2, 2]))
    tensor([-1.,  1.,  0.,  0.,  0.,  1., -1.])
    """
    role_B = torch.zeros_like(rewards_B, dtype=torch.float32)
    for group in torch.unique(group_B).tolist():
        rows_R = torch.nonzero(group_B == group)[:, 0]
        rewards_R = rewards_B[rows_R]
        if rewards_R.max() == rewards_R.min():
            continue
        # argmax/argmin of the first occurrence: a stable order, whatever the device
        best = rows_R[int(torch.nonzero(rewards_R == rewards_R.max())[0])]
        worst = rows_R[int(torch.nonzero(rewards_R == rewards_R.min())[0])]
        role_B[best], role_B[worst] = 1.0, -1.0
    return role_B


@register_advantage("best_worst")
def best_worst(inputs: AdvantageInputs) -> torch.Tensor:
    """The pairs of ``online_dpo``: +1 on the tokens of each group's best rollout, -1 on its
    worst's (rewards less any KL penalty folded into them), 0 elsewhere."""
    role_B = best_and_worst(sequence_rewards(inputs), inputs.group_B.to(inputs.rewards_B.device))
    return role_B.to(inputs.mask_BT)[:, None] * inputs.mask_BT


def pair_rows(role_B: torch.Tensor, group_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of each complete pair in a micro-batch: ``(chosen_P, rejected_P)``, ordered by
    group; a group whose chosen or rejected row is elsewhere is left out (the learner keeps a
    group's rows together, so that happens only in hand-made batches).

    >>> pair_rows(torch.tensor([0.0, -1.0, 1.0, 1.0]), torch.tensor([4, 4, 4, 7]))
    (tensor([2]), tensor([1]))
    """
    chosen, rejected = [], []
    for group in torch.unique(group_B).tolist():
        in_group_B = group_B == group
        best_R = torch.nonzero(in_group_B & (role_B > 0))[:, 0]
        worst_R = torch.nonzero(in_group_B & (role_B < 0))[:, 0]
        if len(best_R) and len(worst_R):
            chosen.append(int(best_R[0]))
            rejected.append(int(worst_R[0]))
    as_rows = lambda rows: torch.tensor(rows, dtype=torch.long, device=role_B.device)  # noqa: E731
    return as_rows(chosen), as_rows(rejected)


@register_loss("online_dpo", zero_at_zero_advantage=True, paired=True, reference=True, advantage="best_worst")
def online_dpo(inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO on each group's (best, worst) pair; per token, the pair's loss over its tokens.

    Reads the roles from the sign of the advantages (``best_worst``), the groups from
    ``group_B``, the reference from ``ref_logprobs_BT`` and ``beta``. Metrics, over the pairs
    of the micro-batch: ``pref/accuracy`` (share whose chosen log-ratio exceeds the rejected
    one's), ``pref/margin`` (``beta`` times the difference), ``pref/chosen_logratio`` and
    ``pref/rejected_logratio`` (policy minus reference summed log-probs)."""
    if inputs.group_B is None or inputs.ref_logprobs_BT is None:
        raise ValueError("online_dpo needs each row's group (group_B) and the reference's log-probs")
    mask_BT = inputs.mask_BT
    role_B = (inputs.advantages_BT * mask_BT).sum(-1).sign()
    chosen_P, rejected_P = pair_rows(role_B, inputs.group_B)
    logps_B, lengths_B = sequence_logprobs(inputs.logprobs_BT, mask_BT)
    ref_B, _ = sequence_logprobs(inputs.ref_logprobs_BT, mask_BT)
    loss_P, rewards = PREFERENCE_LOSSES["dpo"](PairInputs(
        chosen_logps_B=logps_B[chosen_P], rejected_logps_B=logps_B[rejected_P],
        chosen_lengths_B=lengths_B[chosen_P], rejected_lengths_B=lengths_B[rejected_P],
        ref_chosen_logps_B=ref_B[chosen_P], ref_rejected_logps_B=ref_B[rejected_P], beta=inputs.beta))
    # each pair's loss, shared evenly by the trained tokens of its two rows
    per_token_P = loss_P / (lengths_B[chosen_P] + lengths_B[rejected_P]).clamp(min=1)
    per_token_B = torch.zeros_like(logps_B).index_put((chosen_P,), per_token_P).index_put((rejected_P,), per_token_P)
    chosen_reward_P, rejected_reward_P = rewards["rewards/chosen"], rewards["rewards/rejected"]
    pairs = len(chosen_P)
    mean = lambda values_P: float(values_P.float().mean()) if pairs else 0.0  # noqa: E731
    metrics = {"pref/accuracy": mean(chosen_reward_P > rejected_reward_P),
               "pref/margin": mean(chosen_reward_P - rejected_reward_P),
               "pref/chosen_logratio": mean(chosen_reward_P / inputs.beta),
               "pref/rejected_logratio": mean(rejected_reward_P / inputs.beta)}
    return per_token_B[:, None] * mask_BT, metrics
