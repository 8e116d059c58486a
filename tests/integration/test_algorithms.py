"""Every advantage estimator with ppo_clip, and every loss with grpo, through real RL steps.

Each case is a short `train()` run on the miniature built-in model (pre-trained once per
session into a private cache): sampled, scored, turned into advantages and learned from
exactly as `temper train` does. Every step's numbers are finite, each variant reports its
own metrics, and the first step goes the right way, checked outside the code under test
from the batch it trained on (recorded by a pass-through around ``make_batch``): the
variant's advantages rank a group's rollouts as their rewards do, and the update raised
the log-probability of the completion tokens in proportion to their advantages (the
first-order change of every policy loss here, whose gradient at ratio 1 is the
advantage-weighted log-likelihood's). Whether a variant learns well over many steps is the
benchmark's question (bench/algorithms.py), not this test's.
"""

import importlib
import json
import math

import pytest
import torch

from tempering.config import TrainConfig
from tempering.learner.forward import forward_logprobs
from tempering.train import train

LOOP = importlib.import_module("tempering.train")
"""The loop's module (``tempering.train`` as an attribute is the API's function)."""

RUN = {
    "steps": 2,
    "threads": 1,
    "tasks": [{"name": name, "options": {"digits": [2]}} for name in ("add", "sub")],
    "rollout": {"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 24},
    "learner": {"lr": 1e-4, "warmup_steps": 0, "micro_batch_size": 8},
    "eval": {"problems_per_task": 1, "max_new_tokens": 24},
}
STEP_KEYS = {"reward", "accuracy", "loss", "grad_norm", "lr", "entropy", "dropped_fraction", "zero_signal_fraction",
             "truncated_fraction", "sampling_rounds", "generate_s", "learn_s", "completion_tokens"}

EXACT_ONLY = [{"name": name, "options": {"digits": [2]}, "rewards": {"exact_match": 1.0}} for name in ("add", "sub")]
"""Tasks graded 0/1 only: the miniature model is rarely right, so most groups are flat."""


def _algorithm(**fields):
    return {"algorithm": fields}


CASES = {
    # each estimator x ppo_clip
    "grpo": ({}, {"clip_fraction"}),
    "dr_grpo": (_algorithm(advantage="dr_grpo", aggregation="token_sum_norm"), {"clip_fraction"}),
    "rloo": (_algorithm(advantage="rloo"), {"clip_fraction"}),
    "reinforce_pp": (_algorithm(advantage="reinforce_pp", gamma=0.99), {"clip_fraction"}),
    "reinforce_pp_baseline": (_algorithm(advantage="reinforce_pp_baseline"), {"clip_fraction"}),
    "gae_head": (_algorithm(advantage="gae", gamma=0.99, lam=0.95), {"clip_fraction", "value_loss"}),
    "gae_model": (_algorithm(advantage="gae", critic="model"), {"clip_fraction", "value_loss"}),
    # each loss x grpo
    "dual_clip": (_algorithm(loss="dual_clip"), {"clip_fraction", "dual_clip_fraction"}),
    "gspo": (_algorithm(loss="gspo", aggregation="seq_mean_token_mean", clip_low=3e-4, clip_high=4e-4),
             {"clip_fraction"}),
    "cispo": (_algorithm(loss="cispo", clip_low=1.0, clip_high=0.28), {"clip_fraction"}),
    "reinforce": (_algorithm(loss="reinforce", aggregation="seq_mean_token_sum"), {"ratio_mean"}),
    # KL, entropy, and DAPO's techniques with several updates per batch
    "kl_loss_entropy": (_algorithm(kl_coef=0.05, kl_estimator="k3", entropy_coef=0.01), {"kl", "kl_coef"}),
    "kl_reward_adaptive": (_algorithm(advantage="rloo", kl_coef=0.05, kl_estimator="k1", kl_in_reward=True,
                                      kl_target=0.01, kl_horizon=10), {"kl", "kl_coef"}),
    "dapo": ({**_algorithm(dynamic_sampling=True, max_extra_rounds=2, overlong_filter=True, overlong_buffer=8,
                           clip_high=0.28),
              "learner": {**RUN["learner"], "ppo_epochs": 2, "mini_batches": 2}, "tasks": EXACT_ONLY},
             {"overlong_penalty", "dropped_groups"}),
}


class FirstBatch:
    """A pass-through around ``make_batch`` keeping the first step's batch, its rewards and
    groups, and its completion log-probs under the policy at each later ``make_batch`` call
    (the first: before the step's update; the second: after it)."""

    def __init__(self, make_batch):
        self.make_batch = make_batch
        self.batch = self.rewards_B = self.group_B = None
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, groups, *args):
        batch = self.make_batch(groups, *args)
        learner = args[2]
        if self.batch is None:
            self.batch = batch
            self.rewards_B = torch.tensor([r.reward for g in groups for r in g.rollouts])
            self.group_B = torch.tensor([i for i, g in enumerate(groups) for _ in g.rollouts])
        with torch.no_grad():
            first = self.batch
            self.logprobs.append(forward_logprobs(learner.model, first.input_ids_BT, first.attention_mask_BT,
                                                  keep_BT=first.loss_mask_BT).logprobs_BT * first.loss_mask_BT)
        return batch

    def advantage_reward_agreement(self) -> float:
        """Sum over rollouts of (mean advantage of its tokens) x (its reward - its group's mean reward)."""
        mask_BT = self.batch.loss_mask_BT
        advantage_B = (self.batch.advantages_BT * mask_BT).sum(1) / mask_BT.sum(1).clamp(min=1)
        mean_G = torch.zeros(int(self.group_B.max()) + 1).index_add_(0, self.group_B, self.rewards_B)
        mean_G /= torch.bincount(self.group_B)
        return float((advantage_B * (self.rewards_B - mean_G[self.group_B])).sum())

    def advantage_weighted_change(self) -> float:
        """Sum over trained tokens of advantage x (log-prob after the update - before), per token."""
        change_BT = self.logprobs[1] - self.logprobs[0]
        return float((self.batch.advantages_BT * change_BT).sum() / self.batch.loss_mask_BT.sum())


@pytest.mark.parametrize("name", list(CASES))
def test_a_short_run_is_finite_reports_its_metrics_and_steps_the_right_way(name, tiny_model_dir, tmp_path,
                                                                           monkeypatch):
    overrides, keys = CASES[name]
    pretrain = json.loads((tiny_model_dir / "pretrain.json").read_text())["config"]
    config = TrainConfig.model_validate({**RUN, **overrides, "pretrain": pretrain, "run_dir": str(tmp_path / "run")})
    first = FirstBatch(LOOP.make_batch)
    monkeypatch.setattr(LOOP, "make_batch", first)

    train(config, progress=False)

    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert STEP_KEYS | keys <= set(record), (STEP_KEYS | keys) - set(record)
        assert all(math.isfinite(v) for v in record.values() if isinstance(v, float)), record
        assert 0.0 <= record["dropped_fraction"] <= record["zero_signal_fraction"] <= 1.0
    assert first.advantage_reward_agreement() > 0, "the better rollouts of a group got the larger advantages"
    # deterministic: 0 exactly when no weight moved; at lr 1e-4 every variant is in the
    # first-order regime (at 1e-3 the GAE ones were not: Adam moves every weight by about lr
    # however small the advantages)
    assert first.advantage_weighted_change() > 0, "the update favoured the tokens with positive advantages"
    if name == "dapo":
        # flat groups were dropped and extra rounds sampled (bounded by max_extra_rounds=2)
        assert any(r["dropped_groups"] > 0 for r in records)
        assert all(1 <= r["sampling_rounds"] <= 3 for r in records)
        assert any(r["sampling_rounds"] > 1 for r in records)
