"""Held-out evaluation and `temper eval` on the miniature built-in model.

The model, the sampler and the CLI are real; where a test needs a grader that fails or that
reads an option, it registers a small reward of its own, so the outcome does not depend on
what the miniature model happens to write.
"""

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tempering.cli import main
from tempering.eval.greedy import evaluate
from tempering.reporting.metrics import before_after_table
from tempering.rewards import RewardResult, register_reward
from tempering.rewards.base import REWARDS
from tempering.rollout.hf import HFGenerator
from tempering.types import Problem


def _graded_by_id(problem: Problem, completion: str) -> RewardResult:
    """1 for ids starting with 'right', 0 for 'wrong', a grader failure for 'down'."""
    if problem.id.startswith("down"):
        return RewardResult(0.0, error="grader down")
    return RewardResult(float(problem.id.startswith("right")))


def _probe(problem: Problem, completion: str, *, credit: float = 0.0) -> float:
    """Whatever its option says: shows which options reached the grader."""
    return credit


for _name, _fn in (("graded_by_id", _graded_by_id), ("probe", _probe)):
    if _name not in REWARDS:
        register_reward(_name)(_fn)


@dataclass
class FixedTask:
    name: str
    ids: list
    metric: str = "graded_by_id"
    domain: str = ""

    def eval_problems(self, n):
        return [Problem(task=self.name, id=i, prompt="12+34=", answer="46") for i in self.ids[:n]]


def test_grader_failures_are_counted_apart_and_left_out_of_accuracy(tiny_policy):
    tasks = [FixedTask("mixed", ["right0", "right1", "down0", "wrong0"]), FixedTask("broken", ["down0", "down1"])]

    result = evaluate(HFGenerator(*tiny_policy), tasks, problems_per_task=10, max_new_tokens=4)

    assert result["per_task"] == {"mixed": 2 / 3, "broken": None}
    assert result["grader_errors"] == {"mixed": 1, "broken": 2}
    assert result["problems"] == {"mixed": 4, "broken": 2}
    assert result["accuracy"] == 2 / 3


def test_the_before_after_table_shows_grader_errors_only_when_there_are_some():
    before = {"accuracy": 0.5, "per_task": {"add": 0.5, "m": None}, "grader_errors": {"add": 0, "m": 3}}
    after = {"accuracy": 0.75, "per_task": {"add": 0.75, "m": 1.0}, "grader_errors": {"add": 2, "m": 0}}
    lines = before_after_table(before, after).splitlines()
    assert lines[0].split() == ["task", "before", "after", "change", "grader", "errors"]
    assert lines[1].split() == ["add", "50.0%", "75.0%", "+25.0", "0", "->", "2"]
    assert lines[2].split() == ["m", "n/a", "100.0%", "n/a", "3", "->", "0"]
    assert lines[3].split() == ["mean", "50.0%", "75.0%", "+25.0", "3", "->", "2"]
    clean = {"accuracy": 0.5, "per_task": {"add": 0.5}, "grader_errors": {"add": 0}}
    assert before_after_table(clean, clean).splitlines()[0].split() == ["task", "before", "after", "change"]


def test_temper_eval_with_default_settings_prints_json_for_builtin_and_reasoning_gym_tasks(
        tmp_path, tiny_model_dir, tempering_cache):
    pytest.importorskip("reasoning_gym")
    env = {**os.environ, "TEMPERING_CACHE": str(tempering_cache)}
    tasks = 'tasks=[{name: add, options: {digits: [2]}}, {name: "rg:basic_arithmetic"}]'

    result = subprocess.run([sys.executable, "-m", "tempering.cli", "eval", tasks, "--model", str(tiny_model_dir),
                             "--json", "-"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)

    assert result.returncode == 0, result.stderr[-2000:]
    printed = json.loads(result.stdout)
    names = ["add", "rg:basic_arithmetic"]
    # the quickstart's 200 problems per task; the reasoning-gym task holds 64 by default
    assert printed["problems"] == {"add": 200, "rg:basic_arithmetic": 64}
    assert printed["grader_errors"] == {"add": 0, "rg:basic_arithmetic": 0}
    assert list(printed["per_task"]) == names and all(0 <= v <= 1 for v in printed["per_task"].values())
    assert printed["accuracy"] == pytest.approx(sum(printed["per_task"].values()) / 2)
    assert list(printed["examples"]) == names


def test_temper_eval_grades_with_the_configs_reward_options(tmp_path, tiny_model_dir, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(3)))
    config = tmp_path / "eval.yaml"
    config.write_text(json.dumps({
        "tasks": [{"name": "dataset", "options": {"path": str(data), "eval_path": str(data), "kind": "text",
                                                  "reward": "probe", "style": "raw"}}],
        "rewards": {"options": {"probe": {"credit": 1.0}}},
        "eval": {"problems_per_task": 3, "max_new_tokens": 4}}))

    with pytest.raises(SystemExit) as exited:
        main(["eval", str(config), "--model", str(tiny_model_dir), "--json", "-"])

    assert exited.value.code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["per_task"] == {"dataset": 1.0}, "graded with credit=1.0 from rewards.options"
    assert printed["problems"] == {"dataset": 3}


def test_completions_cut_off_at_the_length_limit_are_counted_as_truncated(tiny_policy):
    tasks = [FixedTask("cut", ["right0", "wrong0", "right1"])]
    generator = HFGenerator(*tiny_policy)

    short = evaluate(generator, tasks, problems_per_task=10, max_new_tokens=1)
    # the built-in model writes a worked solution of several lines: one token is never all of it
    assert short["truncated"] == {"cut": 3}
    assert short["per_task"] == {"cut": 2 / 3}  # graded as written, and counted apart
    table = before_after_table(short, short)
    assert table.splitlines()[0].split()[-1] == "truncated"
    assert "3 -> 3" in table and "raise eval.max_new_tokens" in table


def test_the_table_has_no_truncated_column_when_nothing_was_cut_off():
    clean = {"accuracy": 0.5, "per_task": {"add": 0.5}, "grader_errors": {"add": 0}, "truncated": {"add": 0}}
    assert "truncated" not in before_after_table(clean, clean)
