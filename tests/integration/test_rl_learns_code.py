"""RL learns to code: a short GRPO run with the ``code`` reward, every program run in the real
sandbox, lifts a miniature coder's mean reward past a stated margin, and the same run with the
policy-gradient direction reversed or with no advantage at all does not.

The miniature coder is the built-in model pre-trained here (450 steps in float32, under a
minute of one core) on ``multiples`` (one comprehension whose constant is a single digit, 2 to
6: the tiny model copies a two-digit constant, as the other list families draw at level 1,
only after many more steps), 60% of its corpus with the family's classic bug (``x % k`` for
``x % k == 0``). It copies the constant well by then, so about two samples in five pass every
hidden case and the rest are mostly the bug: RL removes the bug, a steady climb to about nine
in ten within ten steps that holds to the end, not a wander among constants (300 steps left it
copying badly, and the reward rose to about 0.4 and fell back, by a margin that depended on
the CPU's float order). Pre-training in float32 keeps the model the same on CPUs with and
without bfloat16 instructions. The measure is the mean training reward of the last ten steps
(1,280 rollouts) against the first two (256, sampled before the policy has moved much): on an
AMD EPYC the lift was +0.47 for two seeds, the zeroed control's -0.01 to -0.03, the flipped
control's -0.23, against a margin of 0.25. The controls plug a flipped and a zeroed estimator
in through ``algorithm.advantage: module:function``, as in ``test_rl_learns``; a loss whose
sign is reversed, or advantages that never reach it, fail the first case.
"""

from __future__ import annotations

import pytest

from tempering.config import PretrainConfig
from tempering.pretrain import ensure_pretrained

from learning import CONTROLS, check_lift, run_metrics

LIFT = 0.25
"""How much the mean reward of the last ten steps must exceed that of the first two."""

FAMILIES = ["multiples"]

MINI_CODER = {
    "tasks": [{"name": "code", "options": {"families": FAMILIES}}],
    "hidden_size": 64, "layers": 2, "heads": 4, "max_positions": 192,
    "steps": 450, "batch_docs": 16, "lr": 1e-2, "warmup_steps": 10, "bf16": False,
}
"""PretrainConfig of the miniature coder (seconds to train)."""

RUN = {
    "steps": 24,
    "threads": 1,
    "tasks": [{"name": "code:filter", "options": {"families": FAMILIES}}],
    "rollout": {"prompts_per_step": 16, "group_size": 8, "max_new_tokens": 44},
    "learner": {"lr": 1.5e-3, "warmup_steps": 3, "schedule": "constant"},
    "rewards": {"options": {"code": {"workers": 2}}},
    "eval": {"problems_per_task": 4, "max_new_tokens": 44},
    "checkpoint": {"every": 0},
}


@pytest.fixture(scope="module")
def mini_coder(tempering_cache):
    return ensure_pretrained(PretrainConfig(**MINI_CODER), progress=False)


@pytest.mark.parametrize("advantage, learns", CONTROLS)
def test_grpo_on_sandbox_rewards_lifts_mean_reward_and_its_broken_twins_do_not(
        sandbox_executor, mini_coder, tmp_path, advantage, learns):
    records = run_metrics({**RUN, "pretrain": MINI_CODER}, advantage, tmp_path)
    ran = sum(r.get("diag/code/status/passed", 0) + r.get("diag/code/status/failed", 0) for r in records)
    assert ran > 0.9 * len(records), f"the sandbox did not run the programs: {records[0]}"
    rewards = [r["reward"] for r in records]
    check_lift(rewards, learns, LIFT, head=2, tail=10)
