"""RL in the reflection environment teaches a miniature coder to use feedback: after a short
GRPO run whose episodes are up to three attempts, each failing one answered with the first
failing hidden test, greedy[round<=3] minus greedy[round<=1] on held-out problems grows past a
stated margin; the same run with no advantage (the estimator zeroed) does not.

The miniature coder is the built-in model pre-trained here on ``multiples`` (as in
``test_rl_learns_code``), half of its corpus reflection transcripts (``corpus_reflections``): a
buggy attempt, the environment's feedback, and a second attempt drawn independently of the
feedback, right or buggy as any answer. So it knows the episode's form but not that feedback
says how to fix the code, and greedily it writes the same body again after feedback. RL's
reward is the code reward of the episode's last attempt, in the real sandbox.

Measured on an AMD EPYC (float32, seed 0): GAP_BEFORE_AFTER; the zeroed control's: ZEROED.
"""

from __future__ import annotations

import pytest

from tempering.config import PretrainConfig, TrainConfig
from tempering.pretrain import ensure_pretrained
from tempering.train import train

MARGIN = 0.25
"""How much greedy[round<=3] minus greedy[round<=1] on held-out problems must grow."""

FAMILIES = ["multiples"]

MINI_REFLECTOR = {
    "tasks": [{"name": "code", "options": {"families": FAMILIES, "corpus_reflections": 0.5}}],
    "hidden_size": 64, "layers": 2, "heads": 4, "max_positions": 384,
    "steps": 900, "batch_docs": 16, "lr": 1e-2, "warmup_steps": 10, "bf16": False,
}
"""PretrainConfig of the miniature coder with reflection transcripts in its corpus."""

RUN = {
    "steps": 20,
    "threads": 1,
    "seed": 0,
    "tasks": [{"name": "code", "options": {"families": FAMILIES},
               "env": {"name": "reflection", "max_turns": 3, "max_tokens": 360}}],
    "rollout": {"prompts_per_step": 16, "group_size": 8, "max_new_tokens": 44},
    "learner": {"lr": 1.5e-3, "warmup_steps": 3, "schedule": "constant"},
    "rewards": {"options": {"code": {"workers": 2}}},
    "eval": {"problems_per_task": 24, "max_new_tokens": 44},
    "checkpoint": {"every": 0},
    "pretrain": MINI_REFLECTOR,
}


@pytest.fixture(scope="module")
def mini_reflector(tempering_cache):
    return ensure_pretrained(PretrainConfig(**MINI_REFLECTOR), progress=False)


def _gap(by_round: dict) -> float:
    return by_round["code"]["greedy[round<=3]"] - by_round["code"]["greedy[round<=1]"]


@pytest.mark.parametrize("advantage, learns", [("grpo", True), ("learning:zeroed", False)])
def test_rl_in_the_reflection_env_widens_the_gap_feedback_makes_and_a_zeroed_signal_does_not(
        sandbox_executor, mini_reflector, tmp_path, advantage, learns):
    settings = {**RUN, "algorithm": {"advantage": advantage}, "run_dir": str(tmp_path / "run")}
    summary = train(TrainConfig.model_validate(settings), progress=False)

    before, after = summary["greedy_by_round"]["before"], summary["greedy_by_round"]["after"]
    growth = _gap(after) - _gap(before)
    if learns:
        assert growth > MARGIN, f"the feedback gap grew by {growth:+.3f} (need > {MARGIN}): {before} -> {after}"
    else:
        assert growth < MARGIN / 2, f"a zeroed signal still grew the feedback gap by {growth:+.3f}: {before} -> {after}"
