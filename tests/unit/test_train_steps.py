"""Two pieces of the RL step: scoring groups (the rewarder) and forming the batch (train.make_batch)."""

import pytest
import torch

from tempering.algorithms.advantages import grpo
from tempering.rewards import Rewarder
from tempering.tasks import build_task
from tempering.train import make_batch
from tempering.types import Group, Rollout


def _rollout(problem, text, completion_ids):
    return Rollout(problem=problem, prompt_ids=[1, 5, 6], completion_ids=completion_ids,
                   logprobs=[-0.5] * len(completion_ids), text=text, finish_reason="stop", policy_version=0)


def test_rewarder_scores_rollouts_in_place_and_averages_over_all_of_them():
    task = build_task("add", seed=0)
    problem = task.train_problem(0)
    group = Group(problem, [
        _rollout(problem, f"answer: {problem.answer}", [7]),  # right and well formed: 1 + 0.1
        _rollout(problem, "answer: x", [7]),                  # well formed only: 0.1
        _rollout(problem, "garbage", [7]),                    # 0
    ])

    record = Rewarder([task]).score([group])

    assert [r.reward for r in group.rollouts] == pytest.approx([1.1, 0.1, 0.0])
    assert group.rollouts[1].reward_components == {"exact_match": 0.0, "format": 1.0}
    assert record == pytest.approx({
        "reward": 1.2 / 3, "accuracy": 1 / 3, "reward/exact_match": 1 / 3, "reward/format": 2 / 3,
        "reward/dropped": 0, "reward/errors": 0,
    })


def test_make_batch_puts_each_groups_advantages_on_its_completion_tokens():
    task = build_task("add", seed=0)
    first, second = task.train_problem(0), task.train_problem(1)
    groups = [
        Group(first, [_rollout(first, "", [7, 8]), _rollout(first, "", [9])]),
        Group(second, [_rollout(second, "", [7]), _rollout(second, "", [8, 9, 10])]),
    ]
    for rollout, reward in zip([r for g in groups for r in g.rollouts], [1.0, 0.0, 1.0, 1.0]):
        rollout.reward = reward

    batch = make_batch(groups, grpo, pad_id=0)

    # group 0: rewards 1, 0 -> mean 0.5, unbiased std √0.5 -> ±0.5 / (0.70710678 + 1e-6) = ±0.70710578
    # group 1: equal rewards -> 0
    a = 0.7071057811879616
    expected_BT = torch.tensor([[0, 0, 0, a, a, 0],
                                [0, 0, 0, -a, 0, 0],
                                [0, 0, 0, 0, 0, 0],
                                [0, 0, 0, 0, 0, 0]])
    torch.testing.assert_close(batch.advantages_BT, expected_BT, atol=1e-6, rtol=0)
    assert batch.loss_mask_BT.sum(-1).tolist() == [2, 1, 1, 3]
