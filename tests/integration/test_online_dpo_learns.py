"""Online DPO learns: a short run of ``algorithm.loss: online_dpo`` on the miniature built-in
model lifts its mean reward past a stated margin, and the same run with every pair swapped
(chosen <-> rejected) does not; and a SIGKILLed online DPO run resumes bitwise, its frozen
reference included.

The reward is ``test_rl_learns``'s ``answer: N`` line with an even N, which the miniature model
earns about two times in five to begin with. The swapped control plugs in the pairs of
``best_worst`` with their signs reversed, through ``algorithm.advantage: module:function`` (the
route a user's own pair marking takes), so the only difference from the real run is which
rollout of each pair is preferred. Measured on an AMD EPYC (2 shared cores): the mean reward of
the last 6 of 40 steps was 0.52 above the first 6's, the swapped run's 0.23 below (it unlearns
the even answers), against a margin of 0.3.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from learning import check_lift
from test_resume import step_records, temper, weights
from tempering.algorithms.online_dpo import best_worst
from tempering.config import TrainConfig
from tempering.reporting.metrics import read_jsonl
from tempering.train import train

LIFT = 0.3
"""How much the mean reward of the last steps must exceed that of the first ones."""

RUN = {
    "steps": 40,
    "threads": 1,
    "tasks": [{"name": "add", "options": {"digits": [2]}, "rewards": {"test_rl_learns:even_answer": 1.0}}],
    "rollout": {"prompts_per_step": 8, "group_size": 8, "max_new_tokens": 32},
    "learner": {"lr": 3e-3, "warmup_steps": 0, "schedule": "constant"},
    "eval": {"problems_per_task": 8, "max_new_tokens": 32},
    "checkpoint": {"every": 0},
}


def swapped(inputs) -> torch.Tensor:
    """``best_worst``'s pairs with chosen and rejected swapped: every update prefers the worse rollout."""
    return -best_worst(inputs)


@pytest.mark.parametrize("advantage, learns", [("best_worst", True), (f"{__name__}:swapped", False)])
def test_online_dpo_lifts_mean_reward_and_swapped_pairs_do_not(tiny_model_dir, tmp_path, advantage, learns):
    pretrain = json.loads((tiny_model_dir / "pretrain.json").read_text())["config"]
    run_dir = tmp_path / "run"
    config = {**RUN, "pretrain": pretrain, "run_dir": str(run_dir),
              "algorithm": {"loss": "online_dpo", "advantage": advantage, "dpo_beta": 0.1}}
    train(TrainConfig.model_validate(config), progress=False)
    records = read_jsonl(run_dir / "metrics.jsonl")
    check_lift([r["reward"] for r in records], learns, LIFT, head=6, tail=6)


@pytest.mark.slow  # three processes of temper train: 232 s on 2 cores shared with other jobs
def test_a_killed_online_dpo_run_resumes_bitwise_with_its_reference(tmp_path: Path, tiny_model_dir: Path):
    args = ["steps=6", "threads=1", "rollout.prompts_per_step=4", "rollout.group_size=4",
            "rollout.max_new_tokens=24", "eval.problems_per_task=4", "eval.max_new_tokens=24",
            "checkpoint.every=1", "checkpoint.keep=2", f"model.path={tiny_model_dir}",
            "algorithm.loss=online_dpo", "algorithm.advantage=best_worst", "learner.lr=3e-3"]
    reference, run = tmp_path / "reference", tmp_path / "run"
    assert temper(*args, "--run-dir", str(reference)) == 0
    assert temper(*args, "--run-dir", str(run), kill_at="learn:4") != 0  # killed in its 4th learner step
    assert temper("--resume", str(run)) == 0
    # a reference rebuilt from the resumed policy instead of the saved one changes every later step
    assert step_records(run) == step_records(reference)
    assert weights(run) == weights(reference)
