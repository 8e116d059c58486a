"""Multi-turn environments in real training runs of the miniature model: sync and async
pipelines train on episodes, log their turns and counters per step, and evaluate through them."""

from __future__ import annotations

import json

import pytest

from tempering.config import TrainConfig
from tempering.envs import Step
from tempering.train import train


class Hint:
    """After the model's first line, says the answer is near; two turns at most in practice."""

    stop = ("\n",)

    def __init__(self, penalty: float = -0.05):
        self.penalty, self.turns = penalty, 0

    def reset(self, problem):
        self.answer = problem.answer
        return problem.prompt

    def step(self, completion):
        self.turns += 1
        if f"answer: {self.answer}" in completion or self.turns >= 2:
            return Step(done=True, info={"hints": 0})
        return Step(observation=f"hint: {self.answer[0]}\n", rewards={"penalty": self.penalty}, info={"hints": 1})


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_trains_on_episodes_and_logs_them(tiny_model_dir, tmp_path, mode):
    run_dir = tmp_path / mode
    config = TrainConfig.model_validate({
        "steps": 3, "threads": 1, "model": {"path": str(tiny_model_dir)},
        "tasks": [{"name": "add", "options": {"digits": [2]}, "env": {"name": f"{__name__}:Hint", "max_turns": 3}},
                  {"name": "sub", "options": {"digits": [2]}}],
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 16},
        "pipeline": {"mode": mode},
        "eval": {"problems_per_task": 4, "max_new_tokens": 16}, "run_dir": str(run_dir)})
    summary = train(config, progress=False)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        assert record["env/turns"] > 0 and "env/hints" in record
    assert any(r["env/hints"] > 0 for r in records)  # some episodes got a hint, a second turn
    assert any(r.get("reward/env/penalty", 0) < 0 for r in records)
    assert set(summary["eval_after"]["per_task"]) == {"add", "sub"}


def test_temper_eval_samples_episodes_and_reports_pass_at_k_by_round(tiny_model_dir, capsys):
    from tempering.cli import main

    tasks = f"tasks=[{{name: add, options: {{digits: [2]}}, env: {{name: '{__name__}:Hint', max_turns: 2}}}}]"
    with pytest.raises(SystemExit) as done:
        main(["eval", str(tiny_model_dir), tasks, "--n", "3", "--k", "1,2", "--problems", "4",
              "--max-new-tokens", "16", "--json", "-", "--quiet"])
    assert done.value.code == 0
    metrics = json.loads(capsys.readouterr().out)["metrics"]["add"]
    assert {"greedy[round<=1]", "greedy[round<=2]", "pass@1[round<=1]", "pass@2[round<=2]"} <= set(metrics)
    assert metrics["pass@1[round<=2]"]["value"] == metrics["pass@1"]["value"]  # round 2 is the last
    assert metrics["pass@1[round<=1]"]["value"] <= metrics["pass@1[round<=2]"]["value"]
