"""What a program that ignores the spec scores on the held-out ``code`` problems; prints JSON.

    python bench/code_baselines.py [--config code] [--problems N]

Two programs that need no model, each graded like a model's completion (the ``code`` reward,
every hidden case run in the sandbox, judged by its parent), per task of the config and over
all of them:

- ``copied_example``: return the value the prompt's example shows, as a constant;
- ``best_constant``: return the one constant (the same for every problem) that passes the most
  held-out problems, found among the hidden cases' expected values; ``best_constant_per_task``
  lets each task pick its own, a stronger baseline still.

A trained model's held-out pass@1 above these is more than echoing the prompt or guessing the
most common answer. The search for the best constant compares expected values here, in the
parent; only the chosen constants' programs run in the sandbox.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from tempering.build import build_tasks
from tempering.config import load_config
from tempering.rewards.base import build_reward
from tempering.tasks.code import CodeTask
from tempering.types import Problem, Rollout


def example_value(problem: Problem) -> str:
    """The source text of the value after ``==`` on the raw prompt's example line."""
    example = problem.prompt.split("\n")[1]
    return example.rsplit(" == ", 1)[1]


def constant_body(value: str) -> str:
    return f"    return {value}\n"


def always_same(problem: Problem) -> str | None:
    """The one value (as JSON) every hidden case expects, None when they differ; a constant
    program can pass only such a problem."""
    values = {json.dumps(case["expected"], sort_keys=True) for case in problem.meta["tests"]["cases"]}
    return values.pop() if len(values) == 1 else None


def best_constant(problems: list[Problem]) -> str:
    """The Python source of the constant that the most problems expect in every case."""
    counts = Counter(v for v in map(always_same, problems) if v is not None)
    return repr(json.loads(counts.most_common(1)[0][0])) if counts else "None"


def pass_rate(reward, problems: list[Problem], bodies: list[str]) -> float:
    rollouts = [Rollout(problem=p, prompt_ids=[], completion_ids=[], logprobs=[], text=body, finish_reason="stop",
                        policy_version=0) for p, body in zip(problems, bodies)]
    results = reward.score_batch(problems, rollouts)
    if errors := [r.error for r in results if r.error]:
        raise SystemExit(f"the sandbox failed on {len(errors)} programs: {errors[0]}")
    return sum(r.score for r in results) / len(results)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="code_baselines.py", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="code", help="a config file or shipped config name (default: code)")
    parser.add_argument("--problems", type=int, help="held-out problems per task (default: eval.problems_per_task)")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    tasks = build_tasks(config)
    if other := [task.name for task in tasks if not (isinstance(task, CodeTask) and task.style == "raw")]:
        raise SystemExit(f"code_baselines.py: --config {args.config}: tasks {other} are not raw-style code tasks "
                         "(the baselines complete a raw prompt's def line, as the built-in coder does)")
    per_task = {task.name: task.eval_problems(args.problems or config.eval.problems_per_task) for task in tasks}
    everything = [p for problems in per_task.values() for p in problems]
    overall = best_constant(everything)
    reward = build_reward("code", config.rewards.options.get("code"))
    try:
        table = {}
        for name, problems in per_task.items():
            own = best_constant(problems)
            table[name] = {
                "problems": len(problems),
                "copied_example": pass_rate(reward, problems, [constant_body(example_value(p)) for p in problems]),
                "best_constant": pass_rate(reward, problems, [constant_body(overall)] * len(problems)),
                "best_constant_per_task": pass_rate(reward, problems, [constant_body(own)] * len(problems)),
                "its_constant": own,
            }
    finally:
        reward.close()

    def mean(key: str) -> float:
        return sum(row[key] for row in table.values()) / len(table)

    return {"config": args.config, "best_constant": overall, "per_task": table,
            "mean": {key: mean(key) for key in ("copied_example", "best_constant", "best_constant_per_task")}}


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
