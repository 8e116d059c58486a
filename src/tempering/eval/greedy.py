"""Greedy held-out evaluation: the accuracy every before/after table is built from.

A problem whose grader failed (``RewardResult.error``: a sandbox fault, a math checker that
timed out, a metric reward that raised or scored no finite number, contained as in training)
says nothing about the model, so it is left out of the accuracy and counted in
``grader_errors`` instead of counting as wrong. A completion cut off at ``max_new_tokens``
is graded as written (usually wrong) and counted in ``truncated``, so a length limit shorter
than the model's answers shows as such and not as a model that cannot solve the task; a
before/after table with a shorter limit before than the answers need would otherwise report
a gain that is only the model learning to be brief.

Accuracy against length: a task that lists ``eval_lengths`` (a ``long_context`` curriculum's
``lengths`` and its ``read_at``) and draws held-out problems at any of them (``eval_problems_at(n, length)``) is
also graded at each length on ``problems_per_length`` problems, the same ones at every
evaluation, so that a curve read before, during and after training compares like with like
while the curriculum's level (which sets the task's own ``eval_problems``) moves; those of
the current level are the first drawn at its length and are sampled once. Not done:
per-length sampled metrics (pass@k).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tqdm import tqdm

from tempering.config import ConfigError
from tempering.rewards.base import BatchReward, build_reward
from tempering.rewards.compose import score_contained
from tempering.rollout.hf import HFGenerator, SamplingParams
from tempering.tasks import Task
from tempering.types import transcript


def build_metrics(tasks: Sequence[Task], options: dict[str, dict[str, Any]] | None = None) -> dict[str, BatchReward]:
    """Each task's ``metric`` reward, built once with its ``options``; a bad option is a
    ConfigError naming it. Options of rewards no metric uses are left alone (a training
    config names rewards that evaluation does not need)."""
    metrics: dict[str, BatchReward] = {}
    for name in dict.fromkeys(task.metric for task in tasks):
        try:
            metrics[name] = build_reward(name, (options or {}).get(name))
        except ValueError as exc:
            close_metrics(metrics)
            raise ConfigError(f"rewards.options.{name}: {exc}") from None
    return metrics


def close_metrics(metrics: Mapping[str, BatchReward]) -> None:
    """Release what the metric rewards hold (sandbox pools, models)."""
    for reward in metrics.values():
        if hasattr(reward, "close"):
            reward.close()


def evaluate(generator: HFGenerator, tasks: Sequence[Task], problems_per_task: int,
             max_new_tokens: int, options: dict[str, dict[str, Any]] | None = None,
             metrics: Mapping[str, BatchReward] | None = None, progress: bool = False,
             stop: Sequence[str] = (), problems_per_length: int = 0) -> dict:
    """``{"accuracy", "per_task", "problems", "grader_errors", "truncated", "examples", "score_by_turns",
    "by_length", "by_depth", "components"}``.

    ``per_task[name]`` is the mean ``metric`` score of the task's greedy completions over the
    held-out problems that were graded (None when none was); ``problems`` counts the problems
    (a task may hold fewer than ``problems_per_task``), ``grader_errors`` those whose grader
    failed and ``truncated`` the completions cut off at ``max_new_tokens``. ``accuracy`` is the
    unweighted mean over the tasks with a number. ``score_by_turns[name]`` sums the graded
    problems' scores by the model turns each episode used (all under 1 without an environment),
    from which accuracy by round is read. The metrics are built from ``options`` and
    closed here, unless the caller passes them built (``metrics``, from :func:`build_metrics`)
    and closes them itself. ``progress`` shows a bar of problems, advanced a task at a time.
    ``stop``: strings that end a completion, the rollouts' own (``rollout.stop``), so that a
    held-out answer is read as far as a training answer is sampled. ``by_length[name]`` maps each
    of a task's ``eval_lengths`` (as a string, as JSON keeps it) to the accuracy of
    ``problems_per_length`` held-out problems drawn at it (None when none was graded); only
    tasks with such lengths have an entry, and none has with ``problems_per_length`` 0.
    ``by_depth[name]`` splits each of those lengths' accuracy by the depth of the problems'
    evidence (:func:`accuracy_by_length`).
    ``components[name]`` maps each component the task's metric reward names in its ``summary``
    (the ``repo`` reward's ``fixed``, ``broke_other_module``, ``test_runs``) to its mean over the
    graded problems; only tasks whose metric names some have an entry.
    """
    owned = build_metrics(tasks, options) if metrics is None else None
    params = SamplingParams(greedy=True, max_new_tokens=max_new_tokens, stop=tuple(stop))
    try:
        used = metrics if owned is None else owned
        seen: dict = {}
        result = _evaluate(generator, tasks, problems_per_task, used, progress, params, seen)
        result["by_length"], result["by_depth"] = accuracy_by_length(generator, tasks, problems_per_length, used,
                                                                     params, seen)
        return result
    finally:
        if owned is not None:
            close_metrics(owned)


def _evaluate(generator: HFGenerator, tasks: Sequence[Task], problems_per_task: int,
              metrics: Mapping[str, BatchReward], progress: bool, params: SamplingParams, seen: dict) -> dict:
    per_task, problems, grader_errors, truncated, examples, by_turns, components = {}, {}, {}, {}, {}, {}, {}
    bar = tqdm(total=problems_per_task * len(tasks), desc="greedy", unit="problem", disable=not progress,
               dynamic_ncols=True, leave=False)
    for task in tasks:
        groups, results = _grade(generator, task, task.eval_problems(problems_per_task), metrics, params, seen)
        bar.update(len(groups))
        graded = [r.score for r in results if r.error is None]
        per_task[task.name] = _mean(graded)
        by_turns[task.name] = _score_by_turns(groups, results)
        problems[task.name], grader_errors[task.name] = len(results), len(results) - len(graded)
        truncated[task.name] = sum(g.rollouts[0].finish_reason == "length" for g in groups)
        if means := component_means(getattr(metrics[task.metric], "summary", ()), results):
            components[task.name] = means
        if groups:
            examples[task.name] = {"prompt": str(groups[0].problem.prompt), "completion": transcript(groups[0].rollouts[0])}
    bar.close()
    known = [value for value in per_task.values() if value is not None]
    return {"accuracy": sum(known) / len(known) if known else None, "per_task": per_task, "problems": problems,
            "grader_errors": grader_errors, "truncated": truncated, "examples": examples, "score_by_turns": by_turns,
            "components": components}


DEPTH_BINS = 5
"""Depth bins of ``by_depth``: fifths of a document, 0-20% (its start) to 80-100% (next to the question)."""


def depth_bin(depth: float) -> str:
    """The label of the :data:`DEPTH_BINS` bin that a depth in [0, 1] falls in.

    >>> depth_bin(0.0), depth_bin(0.2), depth_bin(0.99), depth_bin(1.0)
    ('0-20%', '20-40%', '80-100%', '80-100%')
    """
    index = min(DEPTH_BINS - 1, int(depth * DEPTH_BINS))
    return f"{100 * index // DEPTH_BINS}-{100 * (index + 1) // DEPTH_BINS}%"


def accuracy_by_length(generator: HFGenerator, tasks: Sequence[Task], problems_per_length: int,
                       metrics: Mapping[str, BatchReward], params: SamplingParams, seen: dict | None = None
                       ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, dict[str, Any]]]]:
    """``({task: {str(length): accuracy}}, {task: {str(length): {depth bin: accuracy}}})`` for
    the tasks with ``eval_lengths``: greedy completions of ``problems_per_length`` held-out
    problems drawn at each length, graded by the task's metric (a grader error left out, as in
    :func:`evaluate`), and the same results by how deep in the document the problem's evidence
    starts (:func:`depth_bin` of the task's ``evidence_depth``; a bin no problem fell in is
    None; tasks without depths have no entry): where along a long document the model stops
    finding what it reads. ``seen`` is :func:`_grade`'s record of the problems already graded in
    this evaluation: a curriculum's own held-out problems at its current level are the first of
    those drawn at that length, and are not sampled twice."""
    by_length: dict[str, dict[str, Any]] = {}
    by_depth: dict[str, dict[str, dict[str, Any]]] = {}
    for task in tasks if problems_per_length else ():
        depth_of = getattr(task, "evidence_depth", None)
        for length in getattr(task, "eval_lengths", ()):
            problems = task.eval_problems_at(problems_per_length, length)
            groups, results = _grade(generator, task, problems, metrics, params, seen)
            by_length.setdefault(task.name, {})[str(length)] = _mean([r.score for r in results if r.error is None])
            depths = [depth_of(group.problem) for group in groups] if depth_of else []
            if any(depth is not None for depth in depths):
                scores: dict[str, list[float]] = {depth_bin(i / DEPTH_BINS): [] for i in range(DEPTH_BINS)}
                for depth, result in zip(depths, results):
                    if depth is not None and result.error is None:
                        scores[depth_bin(depth)].append(result.score)
                by_depth.setdefault(task.name, {})[str(length)] = {label: _mean(s) for label, s in scores.items()}
    return by_length, by_depth


def _grade(generator: HFGenerator, task: Task, problems: Sequence, metrics: Mapping[str, BatchReward],
           params: SamplingParams, seen: dict | None = None) -> tuple[list, list]:
    """Greedy completions of ``problems`` (one group each) and their results by the task's metric.

    ``seen`` (kept for one evaluation: the same model, settings and metrics) maps each problem
    graded so far to its group and result; a problem found in it is taken from it, not sampled
    again (greedy decoding would write the same completion), and new ones are added."""
    seen = {} if seen is None else seen
    keys = [(task.name, p.key, p.answer, repr(p.prompt)) for p in problems]
    fresh = {key: p for key, p in zip(keys, problems) if key not in seen}
    if fresh:
        groups = generator.generate(list(fresh.values()), group_size=1, params=params)
        results = score_contained(metrics[task.metric], task.metric, [g.problem for g in groups],
                                  [g.rollouts[0] for g in groups])
        seen.update(zip(fresh, zip(groups, results)))
    graded = [seen[key] for key in keys]
    return [g for g, _ in graded], [r for _, r in graded]


def component_means(names: Sequence[str], results: Sequence) -> dict[str, float]:
    """The mean of each of the components ``names`` over the graded results that carry it.

    >>> from tempering.types import RewardResult
    >>> component_means(["fixed"], [RewardResult(1.0, {"fixed": 1.0}), RewardResult(0.0, {"fixed": 0.0})])
    {'fixed': 0.5}
    """
    found = {}
    for name in names:
        values = [r.components[name] for r in results if r.error is None and name in r.components]
        if values:
            found[name] = sum(values) / len(values)
    return found


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _score_by_turns(groups: Sequence, results: Sequence) -> list[float]:
    """The graded problems' summed scores by the model turns each greedy episode used: entry i
    for episodes of i + 1 turns (a list, so that it reads back the same from JSON)."""
    found: list[float] = []
    for group, result in zip(groups, results):
        if result.error is None:
            turns = group.rollouts[0].model_turns
            found += [0.0] * (turns - len(found))
            found[turns - 1] += result.score
    return found
