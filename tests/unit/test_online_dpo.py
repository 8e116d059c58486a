"""Online DPO on hand-computed inputs: the pairs each group gives, the loss's value and gradient
against the DPO formula (to 1e-6), micro-batches that keep a group whole, and the settings it
refuses."""

import math

import pytest
import torch

from tempering.algorithms import ADVANTAGES, AGGREGATIONS, LOSSES, AdvantageInputs, LossInputs
from tempering.algorithms.online_dpo import best_and_worst
from tempering.config import ConfigError, TrainConfig
from tempering.learner.plan import PlanChoices, plan_update
from tempering.learner.step import collate
from tempering.types import Problem, Rollout


def test_each_group_gives_its_best_and_worst_and_a_flat_group_none():
    rewards_B = torch.tensor([0.2, 1.0, 0.2, 1.0, 0.5, 0.5, 0.5, -1.0, 3.0])
    group_B = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2])
    # group 0: best 1.0 (rows 1 and 3 tie: the first), worst 0.2 (rows 0 and 2: the first); group 1 flat
    assert best_and_worst(rewards_B, group_B).tolist() == [-1, 1, 0, 0, 0, 0, 0, -1, 1]


def test_best_worst_marks_the_trained_tokens_and_counts_a_folded_penalty():
    mask_BT = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    inputs = AdvantageInputs(rewards_B=torch.tensor([1.0, 0.0, 0.5]), group_B=torch.tensor([0, 0, 0]),
                             mask_BT=mask_BT)
    assert ADVANTAGES["best_worst"](inputs).tolist() == [[0, 1, 1], [0, -1, 0], [0, 0, 0]]
    # a penalty of 0.4 per token on row 0's two tokens takes its reward to 0.2: row 2 is then the best
    inputs.penalty_BT = torch.tensor([[0.0, 0.4, 0.4], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert ADVANTAGES["best_worst"](inputs).tolist() == [[0, 0, 0], [0, -1, 0], [1, 1, 1]]


def _dpo(chosen: float, rejected: float, ref_chosen: float, ref_rejected: float, beta: float) -> tuple[float, float]:
    """DPO's loss ``-log sigmoid(beta d)``, ``d = (c - rc) - (r - rr)``, and ``dloss/dc = -beta sigmoid(-beta d)``."""
    d = (chosen - ref_chosen) - (rejected - ref_rejected)
    return -math.log(1 / (1 + math.exp(-beta * d))), -beta / (1 + math.exp(beta * d))


def _pair_batch():
    """Two groups of three rows of 4 positions; trained tokens where the mask is 1."""
    logprobs_BT = torch.tensor([[0.0, -0.5, -1.0, 0.0],     # group 0 chosen: -1.5 over 2 tokens
                                [0.0, -2.0, -0.5, -0.5],    # group 0 rejected: -3.0 over 3
                                [0.0, -0.3, 0.0, 0.0],      # group 0, in no pair
                                [0.0, -1.2, 0.0, 0.0],      # group 1 rejected: -1.2 over 1
                                [0.0, -0.1, -0.2, -0.3],    # group 1 chosen: -0.6 over 3
                                [0.0, -9.0, 0.0, 0.0]], requires_grad=True)
    mask_BT = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 0, 0], [0, 1, 0, 0], [0, 1, 1, 1], [0, 1, 0, 0]],
                           dtype=torch.float32)
    ref_BT = torch.tensor([[0.0, -1.0, -1.0, 0.0], [0.0, -1.0, -1.0, -1.0], [0.0, -0.3, 0.0, 0.0],
                           [0.0, -0.7, 0.0, 0.0], [0.0, -0.5, -0.5, -0.5], [0.0, -9.0, 0.0, 0.0]]) * mask_BT
    roles_B = torch.tensor([1.0, -1.0, 0.0, -1.0, 1.0, 0.0])
    return logprobs_BT, mask_BT, ref_BT, roles_B[:, None] * mask_BT, torch.tensor([0, 0, 0, 1, 1, 1])


def test_online_dpo_value_and_gradient_equal_the_dpo_formula():
    logprobs_BT, mask_BT, ref_BT, advantages_BT, group_B = _pair_batch()
    beta = 0.5
    loss_BT, metrics = LOSSES["online_dpo"](LossInputs(
        logprobs_BT=logprobs_BT, old_logprobs_BT=logprobs_BT.detach(), advantages_BT=advantages_BT,
        mask_BT=mask_BT, ref_logprobs_BT=ref_BT, group_B=group_B, beta=beta))
    loss = AGGREGATIONS["seq_mean_token_sum"](loss_BT, mask_BT, int(mask_BT.sum()), 6)
    loss.backward()

    # group 0: chosen -1.5 vs ref -2.0 (log-ratio 0.5), rejected -3.0 vs ref -3.0 (0): d = 0.5
    # group 1: chosen -0.6 vs ref -1.5 (0.9), rejected -1.2 vs ref -0.7 (-0.5): d = 1.4
    value0, slope0 = _dpo(-1.5, -3.0, -2.0, -3.0, beta)
    value1, slope1 = _dpo(-0.6, -1.2, -1.5, -0.7, beta)
    assert loss.item() == pytest.approx((value0 + value1) / 6, abs=1e-6)  # seq_mean_token_sum: over the 6 rows
    # every trained token of a chosen row gets dloss/dc / 6, of a rejected row its negative; the rest 0
    expected_B = torch.tensor([slope0, -slope0, 0.0, -slope1, slope1, 0.0]) / 6
    torch.testing.assert_close(logprobs_BT.grad, expected_B[:, None] * mask_BT, atol=1e-6, rtol=0)
    assert metrics["pref/accuracy"] == 1.0
    assert metrics["pref/margin"] == pytest.approx(beta * (0.5 + 1.4) / 2, abs=1e-6)
    assert metrics["pref/chosen_logratio"] == pytest.approx((0.5 + 0.9) / 2, abs=1e-6)
    assert metrics["pref/rejected_logratio"] == pytest.approx((0.0 - 0.5) / 2, abs=1e-6)


def test_a_pair_split_between_micro_batches_would_lose_it_so_the_plan_keeps_groups_whole():
    rollouts = [Rollout(problem=Problem(task="add", id=str(g), prompt="p", answer="1"), prompt_ids=[1, 2],
                        completion_ids=[3] * n, logprobs=[-0.5] * n, text="", finish_reason="stop", policy_version=0,
                        loss_mask=[1] * n) for g, n in [(0, 2), (0, 3), (1, 4), (1, 1), (2, 2), (2, 2)]]
    batch = collate(rollouts, pad_id=0)
    batch.group_B = torch.tensor([0, 0, 1, 1, 2, 2])
    batch.advantages_BT = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0])[:, None] * batch.loss_mask_BT
    choices = dict(skip_zero_advantage=True, merge_duplicates=False, share_prompts=False, packing=False,
                   token_budget=0, micro_batch_size=3, chunk=0)
    cut = [part.rows for part in plan_update(batch, PlanChoices(**choices)).micro_batches]
    kept = [part.rows for part in plan_update(batch, PlanChoices(**choices, keep_groups=True)).micro_batches]
    assert cut == [[0, 1, 2], [3, 4, 5]], "without keep_groups, runs of 3 rows split group 1"
    assert kept == [[0, 1], [2, 3], [4, 5]]


def _config(**algorithm) -> TrainConfig:
    return TrainConfig.model_validate({"tasks": [{"name": "add"}], "algorithm": algorithm})


def test_the_settings_online_dpo_cannot_work_with_are_refused():
    from tempering.build import resolve_algorithm

    with pytest.raises(ConfigError, match="set algorithm.advantage=best_worst"):
        resolve_algorithm(_config(loss="online_dpo", advantage="grpo"))
    config = _config(loss="online_dpo", advantage="best_worst")
    config.learner.mini_batches = 2
    with pytest.raises(ConfigError, match="learner.mini_batches=2"):
        resolve_algorithm(config)
    with pytest.raises(Exception, match="group_size"):  # one rollout per problem gives no pair
        TrainConfig.model_validate({"tasks": [{"name": "add"}], "rollout": {"group_size": 1}})
    config.learner.mini_batches = 1
    assert resolve_algorithm(config)["advantage"] is ADVANTAGES["best_worst"]
