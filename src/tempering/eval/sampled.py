"""Sampled evaluation (``temper eval --n N --k 1,5``): pass@k, maj@k and best-of-k beside greedy accuracy.

Each held-out problem gets n completions at the given temperature, graded by the task's
``metric`` reward; the estimators of :mod:`tempering.eval.stats` turn them into numbers that
do not depend on n. Greedy accuracy comes from :func:`tempering.eval.greedy.evaluate` unchanged,
so it is the number ``temper train``'s before/after table shows.

- ``pass@k``: a problem counts when at least one of k samples is correct (metric score 1).
- ``maj@k``: a majority vote over the answers extracted from k samples. The answer voted on
  is what the metric reward reports as ``diagnostics["extracted"]``, else what
  :data:`VOTE_KEYS` extracts for that metric; a metric with neither (code: the samples are
  programs) gets no maj@k, and the result's ``notes`` say so.
- ``best_of@k[verifier]``: the sample the task's own grader scores highest among k. It reads
  the answer key, so it is an oracle (pass@k when scores are 0 or 1), not a method a user
  could deploy.
- ``best_of@k[rm]``: the sample a reward model (``rm:PATH``, a sequence-classification model
  as ``temper rm train`` saves) scores highest among k, graded by the metric: the real
  inference-time method.
- ``best_of@k[prm]``: the sample a process reward model (``prm:PATH``, as ``temper prm train``
  saves one) scores highest among k, its step values aggregated as
  ``rewards.options.process_model.aggregation`` says (default ``min``), graded by the metric.
- ``pass@k[round<=r]`` and ``greedy[round<=r]``, for a task run in an environment of at most
  R model turns, each r in 1..R: a sample counts only when it is correct and its episode used
  at most r turns (for reflection, solved by the r-th attempt; for a tool environment, within
  a budget of r - 1 tool results). Same estimators and intervals; at r = R they equal
  ``pass@k`` and ``greedy``. With partial credit, a later-round solution adds nothing to an
  earlier round (its earlier attempts were not graded).

A sample whose grader failed is left out of its problem (its n shrinks) and counted in
``grader_errors``; a problem left with fewer than k graded samples is left out of that k's
metrics, so each metric carries its own ``problems`` count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Optional

import torch
from tqdm import tqdm

from tempering.eval import stats
from tempering.eval.greedy import evaluate
from tempering.rewards.base import BatchReward
from tempering.rewards.basic import (extract_answer, final_answer, is_lenient, lenient_answer, normalize_text,
                                     parse_number)
from tempering.rewards.compose import score_contained
from tempering.rollout.base import SamplingParams
from tempering.tasks import Task
from tempering.types import Problem

VoteKey = Callable[[Problem, str, Mapping[str, Any]], Optional[str]]
VOTE_KEYS: dict[str, VoteKey] = {}
"""Metric reward name -> ``fn(problem, completion, that reward's options)``: the answer a sample
votes for, extracted as that reward extracts it (None: no answer, no vote). A problem graded
leniently votes with the answer lenient grading reads."""


def register_vote_key(metric: str) -> Callable[[VoteKey], VoteKey]:
    def put(fn: VoteKey) -> VoteKey:
        VOTE_KEYS[metric] = fn
        return fn
    return put


def canonical(answer: Optional[str]) -> Optional[str]:
    """One spelling per answer, so that ``1,024``, ``1024.`` and ``1024.0`` vote together.

    >>> canonical("1,024."), canonical("1024.0"), canonical(" Paris "), canonical(None)
    ('1024', '1024', 'paris', None)
    """
    if answer is None:
        return None
    number = parse_number(answer)
    return str(number) if number is not None else normalize_text(answer)


def _lenient(problem: Problem, completion: str) -> Optional[str]:
    return canonical(lenient_answer(completion, numeric=parse_number(problem.answer) is not None))


@register_vote_key("exact_match")
def _answer_line(problem: Problem, completion: str, options: Mapping[str, Any]) -> Optional[str]:
    return _lenient(problem, completion) if is_lenient(problem) else canonical(extract_answer(completion))


@register_vote_key("match")
def _final_answer(problem: Problem, completion: str, options: Mapping[str, Any]) -> Optional[str]:
    return canonical(final_answer(completion, fallback_last_number=bool(options.get("last_number"))))


@register_vote_key("reasoning_gym")
def _answer_tag(problem: Problem, completion: str, options: Mapping[str, Any]) -> Optional[str]:
    from reasoning_gym.utils import extract_answer as extract_tag

    if is_lenient(problem):
        return _lenient(problem, completion)
    found = extract_tag(completion)
    return canonical(found if found is not None else extract_answer(completion))


@dataclass(frozen=True)
class SampledSettings:
    n: int
    """Completions per problem."""
    ks: tuple[int, ...]
    """The k of every pass@k, maj@k and best-of@k (each at most ``n``)."""
    params: SamplingParams
    seed: int


@dataclass
class ProblemSamples:
    """One problem's graded samples; those whose grader failed are already left out."""

    scores: list[float] = field(default_factory=list)
    answers: list[Optional[str]] = field(default_factory=list)
    ranks: dict[str, list[float]] = field(default_factory=dict)
    """Selector name (``rm``) -> its score of each sample."""
    turns: list[int] = field(default_factory=list)
    """Model turns each sample's episode used (1 for one completion)."""


@dataclass
class TaskSamples:
    problems: list[ProblemSamples]
    samples: int
    grader_errors: int
    truncated: int
    """Samples that hit ``max_new_tokens`` (graded as they are)."""
    votes: bool
    """Whether the samples carry answers to vote on."""


def _grade(problems: Sequence[Problem], rollouts: Sequence, name: str, metric: BatchReward,
           vote_key: Optional[VoteKey], options: Mapping[str, Any]) -> list[tuple[Optional[float], Optional[str]]]:
    """``(score or None when the grader failed, answer voted for)`` of each rollout; a metric
    that raises or scores no finite number is such a failure (:func:`score_contained`)."""
    graded = []
    for problem, rollout, result in zip(problems, rollouts, score_contained(metric, name, problems, rollouts)):
        if "extracted" in result.diagnostics:  # the reward's own reading; the vote key only without one
            extracted = result.diagnostics["extracted"]
        else:
            extracted = vote_key(problem, rollout.text, options) if vote_key else None
        graded.append((None if result.error is not None else result.score,
                       None if extracted is None else str(extracted)))
    return graded


def sample_task(generator, task: Task, metric: BatchReward, options: Mapping[str, Any], count: int,
                settings: SampledSettings, selectors: Mapping[str, BatchReward], bar: tqdm,
                draws: torch.Generator) -> TaskSamples:
    """``settings.n`` graded samples of each of the task's first ``count`` held-out problems,
    generated a batch's worth of problems at a time but no more than a tenth of them, so that
    ``bar`` moves (on a CPU a smaller batch costs about as much per token)."""
    vote_key = VOTE_KEYS.get(task.metric)
    problems = task.eval_problems(count)
    chunk = max(1, min(generator.batch_size // settings.n, -(-len(problems) // 10)))
    out = TaskSamples([], 0, 0, 0, votes=vote_key is not None)
    for start in range(0, len(problems), chunk):
        groups = generator.generate(problems[start:start + chunk], settings.n, settings.params, generator=draws)
        rollouts = [r for g in groups for r in g.rollouts]
        flat = [r.problem for r in rollouts]
        graded = _grade(flat, rollouts, task.metric, metric, vote_key, options)
        ranks = {name: [r.score for r in s.score_batch(flat, rollouts)] for name, s in selectors.items()}
        turns = [r.model_turns for r in rollouts]
        ends = list(accumulate(len(g.rollouts) for g in groups))  # an agent's episode may give several
        for start, end in zip([0, *ends], ends):
            out.problems.append(_problem_samples(graded, ranks, turns, range(start, end)))
        out.samples += len(rollouts)
        out.grader_errors += sum(score is None for score, _ in graded)
        out.truncated += sum(r.finish_reason == "length" for r in rollouts)
        out.votes = out.votes or any(answer is not None for _, answer in graded)
        bar.update(len(rollouts))
    return out


def _problem_samples(graded: list, ranks: Mapping[str, list[float]], turns: list[int], rows: range) -> ProblemSamples:
    kept = [i for i in rows if graded[i][0] is not None]
    return ProblemSamples([graded[i][0] for i in kept], [graded[i][1] for i in kept],
                          {name: [values[i] for i in kept] for name, values in ranks.items()},
                          [turns[i] for i in kept])


def _summary(values: list[float], seed: int) -> dict:
    """``{"value", "ci", "problems"}``: the mean over problems with its bootstrap interval."""
    if not values:
        return {"value": None, "ci": None, "problems": 0}
    return {"value": sum(values) / len(values), "ci": list(stats.bootstrap_interval(values, seed)),
            "problems": len(values)}


Estimate = Callable[[ProblemSamples, int], float]


def _solved(p: ProblemSamples, rounds: int) -> int:
    """Samples correct within ``rounds`` model turns (0: however many they used)."""
    return sum(s >= 1 and (not rounds or t <= rounds) for s, t in zip(p.scores, p.turns or [1] * len(p.scores)))


def _estimators(samples: TaskSamples, seed: int, verifier: bool, rounds: int) -> dict[str, Estimate]:
    """Metric name pattern (``{k}`` for k) -> one problem's estimate at k."""
    found: dict[str, Estimate] = {"pass@{k}": lambda p, k: stats.pass_at_k(len(p.scores), _solved(p, 0), k)}
    for r in range(1, rounds + 1):
        found[f"pass@{{k}}[round<={r}]"] = lambda p, k, r=r: stats.pass_at_k(len(p.scores), _solved(p, r), k)
    if samples.votes:
        found["maj@{k}"] = lambda p, k: stats.maj_at_k(p.answers, p.scores, k, seed)
    if verifier:
        found["best_of@{k}[verifier]"] = lambda p, k: stats.best_of_k(p.scores, p.scores, k)
    for name in samples.problems[0].ranks if samples.problems else ():
        found[f"best_of@{{k}}[{name}]"] = lambda p, k, name=name: stats.best_of_k(p.scores, p.ranks[name], k)
    return found


def task_metrics(samples: TaskSamples, ks: Sequence[int], seed: int, verifier: bool = False,
                 rounds: int = 0) -> dict[str, dict]:
    """Every sampled metric of one task, named ``pass@k``, ``maj@k`` and ``best_of@k[<selector>]``
    for each selector the samples were ranked by (and ``verifier``, the metric, when asked), and
    ``pass@k[round<=r]`` for r up to ``rounds`` (a task's environment's ``max_turns``; 0 = none)."""
    usable = {k: [p for p in samples.problems if len(p.scores) >= k] for k in ks}
    return {pattern.format(k=k): _summary([estimate(p, k) for p in usable[k]], seed)
            for pattern, estimate in _estimators(samples, seed, verifier, rounds).items() for k in ks}


def greedy_metric(result: dict, name: str) -> dict:
    """The greedy accuracy of task ``name`` with Wilson's interval over its graded problems."""
    return _greedy_entry(result["per_task"][name], result["problems"][name] - result["grader_errors"][name])


def greedy_by_round(result: dict, name: str, rounds: int) -> dict[str, dict]:
    """``greedy[round<=r]`` of task ``name`` for r in 1..``rounds``: the greedy score counted
    only for the episodes that used at most r model turns, with Wilson's interval."""
    graded = result["problems"][name] - result["grader_errors"][name]
    by_turns = result["score_by_turns"][name]
    found = {}
    for r in range(1, rounds + 1):
        score = sum(by_turns[:r])
        found[f"greedy[round<={r}]"] = _greedy_entry(score / graded if graded else None, graded)
    return found


def _greedy_entry(value: Optional[float], graded: int) -> dict:
    if value is None:
        return {"value": None, "ci": None, "problems": 0}
    return {"value": value, "ci": list(stats.wilson_interval(value * graded, graded)), "problems": graded}


def sampled_evaluate(generator, tasks: Sequence[Task], problems_per_task: int, max_new_tokens: int,
                     metrics: Mapping[str, BatchReward], options: Mapping[str, dict],
                     settings: Optional[SampledSettings], selectors: Mapping[str, BatchReward],
                     verifier: bool, progress: bool, rounds: Optional[Mapping[str, int]] = None,
                     stop: Sequence[str] = (), problems_per_length: int = 0) -> dict:
    """:func:`~tempering.eval.greedy.evaluate`'s greedy result, plus ``metrics`` (task -> metric
    name -> ``{"value", "ci", "problems"}``), ``samples`` (task -> counts) and ``notes``;
    without ``settings`` only greedy accuracy is measured. ``selectors`` rank samples for
    best-of-k (``{"rm": reward model}``); ``verifier`` adds best-of-k by the metric itself.
    ``rounds`` (task -> its environment's ``max_turns``) adds the by-round metrics. ``stop``
    ends the greedy completions (the sampled ones stop at ``settings.params.stop``);
    ``problems_per_length`` is greedy accuracy against length's (``by_length``)."""
    rounds = rounds or {}
    result = evaluate(generator, tasks, problems_per_task, max_new_tokens, metrics=metrics, progress=progress,
                      stop=stop, problems_per_length=problems_per_length)
    result["metrics"] = {t.name: {"greedy": greedy_metric(result, t.name),
                                  **greedy_by_round(result, t.name, rounds.get(t.name, 0))} for t in tasks}
    result["samples"], result["notes"] = {}, []
    if settings is None:
        result["notes"] += truncation_notes(result, max_new_tokens)
        return result
    draws = torch.Generator().manual_seed(settings.seed)
    total = sum(result["problems"].values()) * settings.n  # evaluate() counted each task's problems
    with tqdm(total=total, desc="samples", unit="sample", disable=not progress, dynamic_ncols=True) as bar:
        for task in tasks:
            samples = sample_task(generator, task, metrics[task.metric], options.get(task.metric) or {},
                                  problems_per_task, settings, selectors, bar, draws)
            result["metrics"][task.name].update(
                task_metrics(samples, settings.ks, settings.seed, verifier, rounds.get(task.name, 0)))
            result["samples"][task.name] = _counts(samples)
            if not samples.votes:
                result["notes"].append(f"{task.name}: no maj@k, its metric {task.metric!r} extracts no answer "
                                       "to vote on (for code, the samples are programs)")
    result["notes"] += truncation_notes(result, max_new_tokens)
    return result


def truncation_notes(result: dict, max_new_tokens: int, share: float = 0.2) -> list[str]:
    """A note for each task whose greedy completions or samples were cut off at the length
    limit more than ``share`` of the time: they are graded as written, so such a score says
    more about the limit than about the model.

    >>> truncation_notes({"truncated": {"humaneval": 38}, "problems": {"humaneval": 41},
    ...                   "samples": {"humaneval": {"samples": 205, "truncated": 193}}}, 48)
    ['humaneval: 38 of 41 greedy completions and 193 of 205 samples stopped at the limit of 48 new tokens and were graded as cut off; raise --max-new-tokens (eval.max_new_tokens)']
    """
    notes = []
    for name, problems in result["problems"].items():
        parts = []
        cut = result["truncated"].get(name, 0)
        if problems and cut > share * problems:
            parts.append(f"{cut} of {problems} greedy completions")
        counts = result.get("samples", {}).get(name)
        if counts and counts["samples"] and counts["truncated"] > share * counts["samples"]:
            parts.append(f"{counts['truncated']} of {counts['samples']} samples")
        if parts:
            notes.append(f"{name}: {' and '.join(parts)} stopped at the limit of {max_new_tokens} new tokens and "
                         "were graded as cut off; raise --max-new-tokens (eval.max_new_tokens)")
    return notes


def _counts(samples: TaskSamples) -> dict:
    graded = [s for p in samples.problems for s in p.scores]
    return {"samples": samples.samples, "grader_errors": samples.grader_errors, "truncated": samples.truncated,
            "mean_score": sum(graded) / len(graded) if graded else None}


def metric_table(result: dict) -> str:
    """Metrics down, tasks across: each cell the value in percent with its 95% interval.

    >>> print(metric_table({"metrics": {"add": {"greedy": {"value": 0.5, "ci": [0.2, 0.8], "problems": 4}}},
    ...                     "samples": {}, "notes": []}))
    metric                  add
    greedy    50.0 [20.0, 80.0]
    """
    names = list(result["metrics"])
    rows = list(dict.fromkeys(m for task in result["metrics"].values() for m in task))
    cells = [["metric", *names]]
    for metric in rows:
        cells.append([metric, *(_cell(result["metrics"][name].get(metric)) for name in names)])
    for key in ("samples", "grader_errors", "truncated") if result["samples"] else ():
        cells.append([key, *(str(result["samples"][name][key]) for name in names)])
    lines = _aligned(cells)
    for task, grid in (result.get("by_depth") or {}).items():
        lines += ["", length_depth_table(task, result["by_length"].get(task, {}), grid)]
    return "\n".join(lines + [f"note: {note}" for note in result["notes"]])


def length_depth_table(task: str, by_length: dict, by_depth: dict) -> str:
    """Greedy accuracy of a task read at several lengths: a row per length, its accuracy over
    all its problems and then by how deep in the document the evidence starts.

    >>> print(length_depth_table("lc", {"256": 0.75, "1024": 0.25},
    ...                          {"256": {"0-50%": 0.5, "50-100%": 1.0}, "1024": {"0-50%": 0.0, "50-100%": None}}))
    lc: greedy accuracy by length (tokens) and evidence depth (0% = the document's start)
    length     all  0-50%  50-100%
    256       75.0   50.0    100.0
    1024      25.0    0.0      n/a
    """
    bins = list(dict.fromkeys(label for row in by_depth.values() for label in row))
    cells = [["length", "all", *bins]] + [
        [length, *(_percent(value) for value in (by_length.get(length), *(row.get(b) for b in bins)))]
        for length, row in by_depth.items()]
    return "\n".join([f"{task}: greedy accuracy by length (tokens) and evidence depth (0% = the document's start)",
                      *_aligned(cells)])


def _aligned(cells: list[list[str]]) -> list[str]:
    """Rows of a table: the first column left-aligned, the others right-aligned, two spaces apart."""
    first = max(len(row[0]) for row in cells) + 2
    widths = [max(len(row[i]) for row in cells) + 2 for i in range(1, len(cells[0]))]
    return [f"{row[0]:<{first}}" + "".join(f"{c:>{w}}" for c, w in zip(row[1:], widths)) for row in cells]


def _percent(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def _cell(entry: Optional[dict]) -> str:
    if not entry or entry["value"] is None:
        return "n/a"
    low, high = entry["ci"]
    return f"{100 * entry['value']:.1f} [{100 * low:.1f}, {100 * high:.1f}]"
