"""RL learns: a short GRPO run on the miniature built-in model lifts its mean reward past a
stated margin, and the same run with the policy-gradient direction reversed or with no
advantage at all does not.

The miniature model is too weak to get sums right in a few steps, so the reward is one it can
earn by what it controls directly: an ``answer: N`` line whose N is even (about two in five of its
answers to begin with). Forty steps take it to about nine in ten: on an AMD EPYC the lift was
+0.53 to +0.62 over three seeds, the zeroed control's -0.02 to +0.07, against a margin of 0.3
that is far outside the step-to-step noise of 64 rollouts.

The negative controls are the test's own proof that it can fail: they plug a flipped and a
zeroed estimator in through ``algorithm.advantage: module:function``, the route a user's
estimator takes, so the only difference from the real run is the sign or size of the signal.
A build whose loss ascends instead of descending, or whose advantages never reach the loss,
fails the first case.
"""

from __future__ import annotations

import json
import re

import pytest

from learning import CONTROLS, check_lift, run_metrics

LIFT = 0.3
"""How much the mean reward of the last steps must exceed that of the first ones."""

RUN = {
    "steps": 40,
    "threads": 1,
    "tasks": [{"name": "add", "options": {"digits": [2]}, "rewards": {f"{__name__}:even_answer": 1.0}}],
    "rollout": {"prompts_per_step": 8, "group_size": 8, "max_new_tokens": 32},
    "algorithm": {"advantage": "grpo"},
    "learner": {"lr": 3e-3, "warmup_steps": 0, "schedule": "constant"},
    "eval": {"problems_per_task": 8, "max_new_tokens": 32},
    "checkpoint": {"every": 0},
}


def even_answer(problem, completion: str) -> float:
    """1 when the completion ends its work with an ``answer: N`` line and N is even.

    >>> even_answer(None, "7+8=15\\nanswer: 84"), even_answer(None, "answer: 85"), even_answer(None, "84")
    (1.0, 0.0, 0.0)
    """
    match = re.search(r"^answer: (-?\d+)\s*$", completion, re.MULTILINE)
    return float(match is not None and int(match.group(1)) % 2 == 0)


@pytest.mark.parametrize("advantage, learns", CONTROLS)
def test_grpo_lifts_mean_reward_and_its_broken_twins_do_not(tiny_model_dir, tmp_path, advantage, learns):
    pretrain = json.loads((tiny_model_dir / "pretrain.json").read_text())["config"]
    rewards = [r["reward"] for r in run_metrics({**RUN, "pretrain": pretrain}, advantage, tmp_path)]
    check_lift(rewards, learns, LIFT, head=6, tail=6)
