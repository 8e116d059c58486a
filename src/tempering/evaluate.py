"""Greedy held-out evaluation: the accuracy every before/after table is built from."""

from __future__ import annotations

from typing import Sequence

from tempering.rewards import score
from tempering.rollout.hf import HFGenerator, SamplingParams
from tempering.tasks import Task


def evaluate(generator: HFGenerator, tasks: Sequence[Task], problems_per_task: int,
             max_new_tokens: int) -> dict:
    """``{"accuracy": mean over tasks, "per_task": {name: accuracy}, "examples": {...}}``.

    Accuracy is the share of held-out problems whose greedy completion scores 1 on the
    task's ``metric`` reward; the overall number is the unweighted mean over tasks.
    """
    params = SamplingParams(greedy=True, max_new_tokens=max_new_tokens)
    per_task, examples = {}, {}
    for task in tasks:
        problems = task.eval_problems(problems_per_task)
        groups = generator.generate(problems, group_size=1, params=params)
        correct = [score(g.problem, g.rollouts[0].text, {task.metric: 1.0})[0] for g in groups]
        per_task[task.name] = sum(correct) / len(correct)
        examples[task.name] = {"prompt": str(groups[0].problem.prompt), "completion": groups[0].rollouts[0].text}
    accuracy = sum(per_task.values()) / len(per_task)
    return {"accuracy": accuracy, "per_task": per_task, "examples": examples}
