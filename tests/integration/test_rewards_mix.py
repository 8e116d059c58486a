"""The ``rewards_mix`` config (outcome + process + format rewards) trains end to end on the
miniature model, logging every component and the monitors at each step."""

import json

import pytest

from tempering.config import load_config
from tempering.train import train


def test_rewards_mix_logs_each_component_and_monitor_every_step(tiny_model_dir, tmp_path):
    pretrain = json.loads((tiny_model_dir / "pretrain.json").read_text())["config"]
    overrides = ["steps=3", "threads=1", f"run_dir={tmp_path / 'run'}", f"pretrain={json.dumps(pretrain)}",
                 "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=32",
                 "eval.problems_per_task=4", "eval.max_new_tokens=32", "eval.every=1"]
    config = load_config("rewards_mix", overrides)
    assert config.tasks[0].rewards == {"exact_match": 1.0, "steps": 0.3, "format": 0.1}
    summary = train(config, progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    components = {"reward/exact_match", "reward/steps", "reward/steps/correct", "reward/steps/leads",
                  "reward/format", "reward/dropped"}
    monitors = {f"monitor/{m}{suffix}" for m in ("heldout_gap", "length_growth", "harness", "same_completion",
                                                  "dominance") for suffix in ("", "/alert")}
    for record in records:
        assert components | monitors <= set(record)
        assert 0.0 <= record["reward/steps"] <= 1.0
        # the logged total is the weighted sum of the logged components
        assert record["reward"] == pytest.approx(record["reward/exact_match"] + 0.3 * record["reward/steps"]
                                                 + 0.1 * record["reward/format"])
    assert set(summary["eval_after"]["per_task"]) == {"add", "sub", "mul"}
