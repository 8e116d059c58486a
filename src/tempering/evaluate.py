"""Greedy held-out evaluation: the accuracy every before/after table is built from."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from tempering.rewards.base import build_reward
from tempering.rollout.hf import HFGenerator, SamplingParams
from tempering.tasks import Task


def evaluate(generator: HFGenerator, tasks: Sequence[Task], problems_per_task: int,
             max_new_tokens: int, options: Optional[dict[str, dict[str, Any]]] = None) -> dict:
    """``{"accuracy": mean over tasks, "per_task": {name: accuracy}, "examples": {...}}``.

    Accuracy is the share of held-out problems whose greedy completion scores 1 on the
    task's ``metric`` reward (built with its ``options``, so batch rewards such as ``code``
    grade in the sandbox); the overall number is the unweighted mean over tasks.
    """
    params = SamplingParams(greedy=True, max_new_tokens=max_new_tokens)
    per_task, examples = {}, {}
    for task in tasks:
        problems = task.eval_problems(problems_per_task)
        groups = generator.generate(problems, group_size=1, params=params)
        metric = build_reward(task.metric, (options or {}).get(task.metric))
        try:
            results = metric.score_batch([g.problem for g in groups], [g.rollouts[0] for g in groups])
        finally:
            if hasattr(metric, "close"):
                metric.close()
        correct = [0.0 if r.error else r.score for r in results]
        per_task[task.name] = sum(correct) / len(correct)
        examples[task.name] = {"prompt": str(groups[0].problem.prompt), "completion": groups[0].rollouts[0].text}
    accuracy = sum(per_task.values()) / len(per_task)
    return {"accuracy": accuracy, "per_task": per_task, "examples": examples}
