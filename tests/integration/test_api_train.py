"""The Python API end to end: ``tempering.train`` from a dict with a reward, an advantage and
a loss registered by decorator, ``tempering.evaluate`` of the checkpoint it wrote (the same
numbers as the run's own final evaluation), ``load_model`` and ``run_code``.

Real components: the miniature model, the sampler, the learner and the sandbox.
"""

import json

import pytest
import torch

import tempering
from tempering.algorithms import ADVANTAGES, LOSSES
from tempering.rewards import REWARDS

CALLS = {"reward": 0, "advantage": 0, "loss": 0}


@pytest.fixture(scope="module")
def plugins():
    @tempering.register_reward("api_short")
    def short(problem: tempering.Problem, completion: str) -> float:
        CALLS["reward"] += 1
        return 1.0 if len(completion) < 20 else 0.0

    @tempering.register_advantage("api_grpo")
    def grpo_counted(inputs: tempering.AdvantageInputs) -> torch.Tensor:
        CALLS["advantage"] += 1
        return ADVANTAGES["grpo"](inputs)

    @tempering.register_loss("api_clip")
    def clip_counted(inputs: tempering.LossInputs):
        CALLS["loss"] += 1
        return LOSSES["ppo_clip"](inputs)

    yield
    for table, name in ((REWARDS, "api_short"), (ADVANTAGES, "api_grpo"), (LOSSES, "api_clip")):
        table.pop(name)


def test_train_from_a_dict_with_decorated_plugins_then_evaluate_and_load_the_checkpoint(plugins, tiny_model_dir,
                                                                                        tmp_path):
    config = {"steps": 2, "threads": 1, "model": {"path": str(tiny_model_dir)}, "checkpoint": {"every": 0},
              "tasks": [{"name": "add", "options": {"digits": [2]}, "rewards": {"exact_match": 1.0, "api_short": 0.5}}],
              "algorithm": {"advantage": "api_grpo", "loss": "api_clip"},
              "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 16},
              "eval": {"problems_per_task": 4, "max_new_tokens": 16}}
    summary = tempering.train(config, ["learner.lr=1e-3"], run_dir=tmp_path / "run")

    assert summary["steps"] == 2 and (tmp_path / "run" / "summary.json").exists()
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("reward/api_short" in step for step in steps)
    assert CALLS["reward"] >= 2 * 2 * 2 and CALLS["advantage"] >= 2 and CALLS["loss"] >= 2

    result = tempering.evaluate(summary["checkpoint"], config, tasks=[config["tasks"][0]])
    assert result["per_task"] == summary["eval_after"]["per_task"], "greedy: the run's own final numbers"
    assert result["model"] == summary["checkpoint"]

    model, tokenizer = tempering.load_model(summary["checkpoint"])
    assert not model.training and model.device.type == "cpu"
    assert tokenizer.decode(tokenizer("12+34=")["input_ids"], skip_special_tokens=True).replace(" ", "") == "12+34="


def test_evaluate_with_samples_reports_pass_at_k(tiny_model_dir):
    result = tempering.evaluate(str(tiny_model_dir), {"eval": {"problems_per_task": 3, "max_new_tokens": 12}},
                                tasks=["mul"], samples=3, k=[1, 3])
    assert set(result["metrics"]["mul"]) >= {"greedy", "pass@1", "pass@3"}
    with pytest.raises(tempering.ConfigError, match="each k must be between 1 and samples"):
        tempering.evaluate(str(tiny_model_dir), tasks=["mul"], samples=2, k=[3])


def test_run_code_runs_a_program_in_the_sandbox():
    try:
        result = tempering.run_code("import sys\nprint(sum(map(int, sys.stdin.read().split())))", stdin="2 3 4\n")
    except tempering.SandboxUnavailable as err:
        pytest.skip(f"no sandbox isolation on this machine: {err}")
    assert (result.status, result.stdout) == ("ok", "9\n")
    assert tempering.run_code("while True: pass", timeout_s=1).status == "timeout"
