"""GRPO advantages on hand-computed inputs: unequal groups, flat groups, a group of one."""

import pytest
import torch

from tempering.algorithms import ADVANTAGES, AdvantageInputs, register_advantage
from tempering.algorithms.advantages import grpo


def test_grpo_golden_values_with_interleaved_groups_of_unequal_size():
    # Rollouts of four groups, deliberately interleaved:
    #   group 0: rewards 1.0, 0.0, 0.5  (rows 0, 2, 5)
    #   group 1: rewards 2.0, 2.0       (rows 1, 6)  all equal
    #   group 2: reward 0.7             (row 3)      a group of one
    #   group 3: rewards 1.0, 0.0       (rows 4, 7)
    rewards_B = torch.tensor([1.0, 2.0, 0.0, 0.7, 1.0, 0.5, 2.0, 0.0])
    group_B = torch.tensor([0, 1, 0, 2, 3, 0, 1, 3])
    mask_BT = torch.ones(8, 1)

    advantages_B = grpo(AdvantageInputs(rewards_B, group_B, mask_BT))[:, 0]

    # group 0: mean 0.5; unbiased var (0.5² + 0.5² + 0²) / (3 - 1) = 0.25, std 0.5;
    #          advantage = ±0.5 / (0.5 + 1e-6) = ±0.999998000004, and 0 for the mean reward.
    # group 1: std 0, so (2 - 2) / (0 + 1e-6) = 0.
    # group 2: one rollout: std is defined as 0, advantage (0.7 - 0.7) / 1e-6 = 0.
    # group 3: mean 0.5; unbiased var (0.25 + 0.25) / 1 = 0.5, std √0.5 = 0.70710678;
    #          advantage = ±0.5 / (0.70710678 + 1e-6) = ±0.70710578.
    expected_B = torch.tensor([
        0.999998000004, 0.0, -0.999998000004, 0.0, 0.7071057811879616, 0.0, 0.0, -0.7071057811879616,
    ])
    torch.testing.assert_close(advantages_B, expected_B, atol=1e-6, rtol=0)


def test_grpo_broadcasts_each_rollouts_advantage_over_its_masked_tokens():
    rewards_B = torch.tensor([3.0, 1.0])
    group_B = torch.tensor([0, 0])
    mask_BT = torch.tensor([[0.0, 1.0, 1.0, 0.0],
                            [0.0, 0.0, 1.0, 1.0]])

    advantages_BT = grpo(AdvantageInputs(rewards_B, group_B, mask_BT))

    # mean 2, unbiased std √((1 + 1) / 1) = √2 = 1.41421356; advantage ±1 / (√2 + 1e-6) = ±0.70710643
    a = 1 / (2**0.5 + 1e-6)
    expected_BT = torch.tensor([[0.0, a, a, 0.0],
                                [0.0, 0.0, -a, -a]])
    torch.testing.assert_close(advantages_BT, expected_BT, atol=1e-6, rtol=0)


def test_grpo_is_invariant_to_shifting_and_scaling_a_groups_rewards():
    group_B = torch.tensor([0, 0, 0])
    mask_BT = torch.ones(3, 2)
    base = grpo(AdvantageInputs(torch.tensor([0.0, 1.0, 1.0]), group_B, mask_BT))
    # 10 * r + 5: the same standardised advantages, up to eps relative to the larger std.
    moved = grpo(AdvantageInputs(torch.tensor([5.0, 15.0, 15.0]), group_B, mask_BT))
    torch.testing.assert_close(moved, base, atol=1e-5, rtol=0)


def test_registry_refuses_a_second_estimator_under_a_taken_name():
    assert ADVANTAGES["grpo"] is grpo
    with pytest.raises(ValueError, match="'grpo' is registered twice"):
        register_advantage("grpo")(lambda inputs: inputs.mask_BT)
