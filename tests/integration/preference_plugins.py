"""A preference loss plugged in by ``module:function``: DPO with its sign flipped, which should
teach the rejected completions (the control of the builtin:arithmetic claim)."""

from tempering.algorithms.preference import dpo


def flipped_dpo(inputs):
    loss_B, rewards = dpo(inputs)
    return -loss_B, rewards
