"""Advantage estimators on hand-computed inputs: unequal groups, flat groups, a group of one,
masks with holes, rows of unequal length, a KL penalty folded into the reward."""

import pytest
import torch

from tempering.algorithms import ADVANTAGES, AdvantageInputs, register_advantage
from tempering.algorithms.advantages import (
    dr_grpo,
    gae,
    grpo,
    grpo_turns,
    needs_values,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
    sequence_rewards,
    token_rewards,
    turn_index,
)


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


# Three groups of unequal size, interleaved, on rows of unequal length (one with a hole):
#   group 0: rows 0, 2, 4 with rewards 1.0, 0.0, 0.5
#   group 1: rows 1, 5    with rewards 2.0, 2.0  (all equal)
#   group 2: row 3        with reward 0.7       (a group of one)
REWARDS_B = torch.tensor([1.0, 2.0, 0.0, 0.7, 0.5, 2.0])
GROUP_B = torch.tensor([0, 1, 0, 2, 0, 1])
MASK_BT = torch.tensor([[0.0, 1.0, 1.0, 0.0],
                        [0.0, 1.0, 0.0, 0.0],
                        [1.0, 1.0, 1.0, 1.0],
                        [0.0, 0.0, 1.0, 1.0],
                        [1.0, 0.0, 1.0, 0.0],
                        [0.0, 1.0, 1.0, 1.0]])


def _per_row(values_B):
    return torch.tensor(values_B)[:, None] * MASK_BT


def test_dr_grpo_subtracts_the_group_mean_and_does_not_divide_by_the_std():
    advantages_BT = dr_grpo(AdvantageInputs(REWARDS_B, GROUP_B, MASK_BT))
    # group 0 mean (1 + 0 + 0.5) / 3 = 0.5 -> 0.5, -0.5, 0.0; group 1 -> 0, 0; group 2 -> 0
    torch.testing.assert_close(advantages_BT, _per_row([0.5, 0.0, -0.5, 0.0, 0.0, 0.0]), atol=1e-6, rtol=0)


def test_rloo_subtracts_the_mean_of_the_other_rollouts_of_the_group():
    advantages_BT = rloo(AdvantageInputs(REWARDS_B, GROUP_B, MASK_BT))
    # group 0: 1.0 - (0.0 + 0.5) / 2 = 0.75;  0.0 - (1.0 + 0.5) / 2 = -0.75;  0.5 - (1.0 + 0.0) / 2 = 0.0
    # group 1: 2 - 2 = 0 twice;  group 2 (one rollout, no others): 0
    torch.testing.assert_close(advantages_BT, _per_row([0.75, 0.0, -0.75, 0.0, 0.0, 0.0]), atol=1e-6, rtol=0)


def test_rloo_on_a_group_of_four():
    advantages_BT = rloo(AdvantageInputs(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.zeros(4, dtype=torch.long),
                                         torch.ones(4, 1)))
    # 1 - 0 = 1;  0 - (1 + 0 + 0) / 3 = -1/3 for each of the others
    torch.testing.assert_close(advantages_BT[:, 0], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]), atol=1e-6, rtol=0)


def test_reinforce_pp_whitens_returns_over_all_trained_tokens_of_the_batch():
    mask_BT = torch.tensor([[0.0, 1.0, 1.0, 0.0],
                            [0.0, 1.0, 0.0, 0.0],
                            [1.0, 0.0, 1.0, 1.0]])
    advantages_BT = reinforce_pp(AdvantageInputs(torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 1, 2]), mask_BT))
    # gamma 1: every trained token's return is its row's reward; the six tokens are
    # 1, 1 | 0 | 0.5, 0.5, 0.5 (groups play no part).
    # mean 3.5 / 6 = 0.58333333; squared deviations 2 * 0.41666667² + 0.58333333² + 3 * 0.08333333²
    # = 0.34722222 + 0.34027778 + 0.02083333 = 0.70833333; unbiased var / 5 = 0.14166667, std 0.37638633
    # -> (1 - 0.58333333) / (0.37638633 + 1e-6) = 1.10701567, (0 - ...) = -1.54982193, (0.5 - ...) = -0.22140313
    a, b, c = 1.1070156657564627, -1.549821932059048, -0.22140313315129267
    expected_BT = torch.tensor([[0.0, a, a, 0.0],
                                [0.0, b, 0.0, 0.0],
                                [c, 0.0, c, c]])
    torch.testing.assert_close(advantages_BT, expected_BT, atol=1e-6, rtol=0)


def test_reinforce_pp_discounts_token_rewards_including_a_kl_penalty():
    mask_BT = torch.tensor([[1.0, 1.0, 1.0],
                            [1.0, 1.0, 0.0]])
    penalty_BT = torch.tensor([[0.1, 0.0, 0.2],
                               [0.2, 0.2, 0.5]])  # the 0.5 is on an untrained token: ignored
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask_BT, penalty_BT=penalty_BT, gamma=0.5)
    # token rewards: row 0: [-0.1, 0.0, 1.0 - 0.2] = [-0.1, 0, 0.8]; row 1: [-0.2, 0.0 - 0.2, 0]
    torch.testing.assert_close(token_rewards(inputs), torch.tensor([[-0.1, 0.0, 0.8], [-0.2, -0.2, 0.0]]))
    # returns, gamma 0.5: row 0: 0.8;  0 + 0.5 * 0.8 = 0.4;  -0.1 + 0.5 * 0.4 = 0.1
    #                     row 1: -0.2; -0.2 + 0.5 * -0.2 = -0.3
    # tokens 0.1, 0.4, 0.8, -0.3, -0.2: mean 0.8 / 5 = 0.16; squared deviations
    # 0.0036 + 0.0576 + 0.4096 + 0.2116 + 0.1296 = 0.812; unbiased var 0.812 / 4 = 0.203, std 0.45055521
    std = 0.203**0.5 + 1e-6
    expected_BT = torch.tensor([[0.1 - 0.16, 0.4 - 0.16, 0.8 - 0.16],
                                [-0.3 - 0.16, -0.2 - 0.16, 0.0]]) / std * mask_BT
    torch.testing.assert_close(reinforce_pp(inputs), expected_BT, atol=1e-6, rtol=0)
    assert expected_BT[0, 2].item() == pytest.approx(1.4204664844767587, abs=1e-6)


def test_reinforce_pp_baseline_subtracts_the_group_mean_then_whitens_over_the_batch():
    mask_BT = torch.tensor([[1.0, 1.0],
                            [1.0, 0.0],
                            [1.0, 1.0],
                            [1.0, 1.0]])
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0, 0.5, 1.0]), torch.tensor([0, 0, 0, 1]), mask_BT)
    # group 0 mean 0.5 -> 0.5, -0.5, 0.0; group 1 (one rollout) -> 0.0
    # tokens 0.5, 0.5 | -0.5 | 0, 0 | 0, 0: mean 0.5 / 7 = 0.07142857;
    # squared deviations 2 * 0.42857143² + 0.57142857² + 4 * 0.07142857² = 0.36734694 + 0.32653061 + 0.02040816
    # = 0.71428571; unbiased var / 6 = 0.11904762, std 0.34503278
    # -> (0.5 - 0.07142857) / (0.34503278 + 1e-6) = 1.24211441, -1.65615254, -0.20701907
    a, b, c = 1.2421144068266716, -1.656152542435562, -0.20701906780444526
    expected_BT = torch.tensor([[a, a], [b, 0.0], [c, c], [c, c]])
    torch.testing.assert_close(reinforce_pp_baseline(inputs), expected_BT, atol=1e-6, rtol=0)


def test_gae_runs_backwards_over_trained_tokens_skipping_holes():
    mask_BT = torch.tensor([[0.0, 1.0, 1.0, 1.0],
                            [1.0, 0.0, 1.0, 0.0]])
    values_BT = torch.tensor([[0.0, 0.5, 0.6, 0.8],
                              [0.2, 9.0, 0.4, 7.0]])  # 9.0 and 7.0 sit on untrained tokens: never read
    penalty_BT = torch.tensor([[0.0, 0.0, 0.0, 0.0],
                               [0.1, 0.0, 0.1, 0.0]])
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0]), torch.tensor([0, 1]), mask_BT, values_BT=values_BT,
                             penalty_BT=penalty_BT, gamma=0.9, lam=0.8)
    # gamma * lam = 0.72; the value after a row's last trained token is 0.
    # row 0 (reward 1 on the last token):
    #   t=3: delta = 1 + 0.9 * 0 - 0.8 = 0.2;        A = 0.2
    #   t=2: delta = 0 + 0.9 * 0.8 - 0.6 = 0.12;     A = 0.12 + 0.72 * 0.2 = 0.264
    #   t=1: delta = 0 + 0.9 * 0.6 - 0.5 = 0.04;     A = 0.04 + 0.72 * 0.264 = 0.23008
    # row 1 (reward 0, penalty 0.1 on each trained token; t=1 is a hole):
    #   t=2: delta = -0.1 + 0.9 * 0 - 0.4 = -0.5;    A = -0.5
    #   t=0: delta = -0.1 + 0.9 * 0.4 - 0.2 = 0.06;  A = 0.06 + 0.72 * -0.5 = -0.3
    expected_BT = torch.tensor([[0.0, 0.23008, 0.264, 0.2],
                                [-0.3, 0.0, -0.5, 0.0]])
    torch.testing.assert_close(gae(inputs), expected_BT, atol=1e-6, rtol=0)


def test_gae_with_gamma_and_lambda_one_is_the_return_minus_the_value():
    mask_BT = torch.tensor([[1.0, 1.0, 1.0]])
    values_BT = torch.tensor([[0.1, 0.4, 0.9]])
    inputs = AdvantageInputs(torch.tensor([2.0]), torch.tensor([0]), mask_BT, values_BT=values_BT)
    # the telescoping sum leaves R - V_t: 2 - 0.1, 2 - 0.4, 2 - 0.9
    torch.testing.assert_close(gae(inputs), torch.tensor([[1.9, 1.6, 1.1]]), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="values_BT"):
        gae(AdvantageInputs(torch.tensor([2.0]), torch.tensor([0]), mask_BT))


def test_a_kl_penalty_in_the_reward_lowers_each_rollouts_reward_by_its_sum():
    mask_BT = torch.tensor([[1.0, 1.0, 0.0],
                            [0.0, 1.0, 1.0]])
    penalty_BT = torch.tensor([[0.1, 0.2, 5.0],
                               [5.0, 0.3, 0.1]])
    inputs = AdvantageInputs(torch.tensor([1.0, 1.0]), torch.tensor([0, 0]), mask_BT, penalty_BT=penalty_BT)
    # 1 - (0.1 + 0.2) = 0.7 and 1 - (0.3 + 0.1) = 0.6; the 5.0s are on untrained tokens
    torch.testing.assert_close(sequence_rewards(inputs), torch.tensor([0.7, 0.6]), atol=1e-6, rtol=0)
    # dr_grpo on them: mean 0.65 -> +0.05, -0.05; equal rewards alone would have given 0
    torch.testing.assert_close(dr_grpo(inputs), torch.tensor([[0.05, 0.05, 0.0], [0.0, -0.05, -0.05]]),
                               atol=1e-6, rtol=0)


def test_grpo_turns_compares_each_turn_with_the_groups_episodes_that_reached_it():
    # One group of four episodes, as the reflection environment plays them: right at once (1),
    # fixed at the second attempt (1), wrong twice (0), wrong three times (0). Prompt token first
    # (untrained), observations between turns (untrained).
    mask_BT = torch.tensor([[0., 1., 1., 0., 0., 0., 0.],
                            [0., 1., 0., 1., 0., 0., 0.],
                            [0., 1., 0., 1., 0., 0., 0.],
                            [0., 1., 0., 1., 0., 1., 1.]])
    rewards_B = torch.tensor([1.0, 1.0, 0.0, 0.0])
    inputs = AdvantageInputs(rewards_B, torch.zeros(4, dtype=torch.long), mask_BT)

    assert turn_index(mask_BT)[3].tolist() == [0, 0, 0, 1, 1, 2, 2]
    advantages_BT = grpo_turns(inputs)

    # turn 0: all four, mean 0.5, std √(4 · 0.25 / 3) = 0.57735027; ±0.5 / (0.57735027 + 1e-6)
    first = 0.5 / (1 / 3 ** 0.5 + 1e-6)
    # turn 1: the three that reached it, rewards 1, 0, 0: mean 1/3, std √((4/9 + 1/9 + 1/9) / 2) = 0.57735027
    fixed, unfixed = (2 / 3) / (1 / 3 ** 0.5 + 1e-6), -(1 / 3) / (1 / 3 ** 0.5 + 1e-6)
    # turn 2: one episode reached it: a group of one, 0
    expected_BT = torch.tensor([[0., first, first, 0., 0., 0., 0.],
                                [0., first, 0., fixed, 0., 0., 0.],
                                [0., -first, 0., unfixed, 0., 0., 0.],
                                [0., -first, 0., unfixed, 0., 0., 0.]])
    torch.testing.assert_close(advantages_BT, expected_BT, atol=1e-6, rtol=0)
    # grpo gives every later attempt the group's verdict, a failing retry and a fixing one alike
    # pushed by the first attempt's baseline
    assert grpo(inputs)[1, 3] == first and grpo(inputs)[2, 3] == -first
    single_BT = torch.tensor([[1., 1.], [1., 0.], [0., 1.]])
    one_turn = AdvantageInputs(torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 0, 1]), single_BT)
    torch.testing.assert_close(grpo_turns(one_turn), grpo(one_turn), atol=0, rtol=0)


def test_every_estimator_is_registered_and_only_gae_needs_a_critic():
    assert {"grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"} <= set(ADVANTAGES)
    assert [name for name in ADVANTAGES if needs_values(ADVANTAGES[name])] == ["gae"]
    assert not needs_values(lambda inputs: inputs.mask_BT), "a plain function from module:function needs none"


def _probe_inputs(dtype):
    """Two groups of two rollouts, three tokens each, with a hole; every optional input filled."""
    mask_BT = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0], [1.0, 0.0, 1.0]], dtype=dtype)
    shaped = torch.arange(12, dtype=dtype).reshape(4, 3)
    return AdvantageInputs(torch.tensor([1.0, 0.0, 0.5, 0.25], dtype=dtype), torch.tensor([0, 0, 1, 1]), mask_BT,
                           values_BT=shaped / 20, penalty_BT=shaped / 100, gamma=0.9, lam=0.8,
                           domain_B=torch.tensor([0, 0, 1, 1]), logprobs_BT=-shaped / 10,
                           teacher_logprobs_BT=-shaped / 7, task_weight=0.5)


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_every_estimator_follows_its_inputs_dtype_and_device(name):
    # float64 inputs: the group estimators' float32 accumulators made index_add_ raise, and the
    # token-level ones returned float32. The default device is meta here and the inputs are on the
    # CPU, so a tensor made without following the inputs (as a CUDA run would meet) fails too.
    expected_BT = ADVANTAGES[name](_probe_inputs(torch.float32))
    inputs = _probe_inputs(torch.float64)
    with torch.device("meta"):
        advantages_BT = ADVANTAGES[name](inputs)
    assert advantages_BT.dtype == torch.float64 and advantages_BT.device.type == "cpu"
    torch.testing.assert_close(advantages_BT, expected_BT.double(), atol=1e-6, rtol=0)
