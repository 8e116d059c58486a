"""Step labels from rollouts (``temper prm label``): the Math-Shepherd estimate.

For each training problem of each task, the policy samples ``solutions`` worked solutions;
each solution's steps are its non-empty lines (:func:`~tempering.rewards.process_model.split_steps`).
For every step but the last, ``continuations`` completions are sampled after the prompt and
the solution up to and including that step, and graded by the task's own ``metric`` reward
(so a reasoning-gym scorer, the sandbox for code, a dataset's answer all work alike); the last
step's "continuation" is the solution itself, graded once. A step's *hard* label is whether
any continuation reached a right answer (metric score 1), its *soft* label the share that
did: the chance that the solution can still be completed right from there.

The output is JSONL: a header line with the settings, then one record per solution::

    {"task": "add", "index": 3, "sample": 0, "prompt": "47+38\\n", "answer": "85",
     "steps": ["7+8=15", "4+3=7", "answer: 75"], "hard": [1, 0, 0], "soft": [0.75, 0.0, 0.0],
     "outcome": 0, "continuations": 4, "grader_errors": 0}

Problems are labelled in order and written whole, so re-running the same command continues
after the last complete problem (a torn last line from a killed run is cut off); each problem
draws from its own seeded stream, so a resumed file equals an uninterrupted one; a larger ``problems`` adds the
problems after those labelled. A file written with other settings is refused rather than
mixed.

A continuation whose grader failed is left out of its step's labels and counted in
``grader_errors``; a step with no graded continuation gets ``null`` labels.

Not done here: tasks played in an environment or by an agent (a step would be a turn),
completer-style labels from a stronger model, deduplicating identical solutions.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from tqdm import tqdm

from tempering.config import ConfigError, TrainConfig
from tempering.rewards.base import BatchReward
from tempering.rewards.compose import score_contained
from tempering.rewards.process_model import prompt_ids, split_steps
from tempering.rollout.base import SamplingParams
from tempering.tasks import Task
from tempering.threads import auto_threads, set_torch_threads
from tempering.types import Problem, Rollout


@dataclass(frozen=True)
class LabelSettings:
    problems: int = 40
    """Training problems labelled per task."""
    solutions: int = 4
    """Solutions sampled per problem, each labelled step by step."""
    continuations: int = 4
    """Completions sampled after each step prefix."""
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 48
    """Longest solution or continuation, in tokens."""
    seed: int = 0
    model: str = ""
    """The policy that samples, as resolved (recorded so that a resumed file is not mixed)."""

    def check(self) -> None:
        """A ConfigError naming the option when a count is below 1."""
        for name in ("problems", "solutions", "continuations", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be at least 1")


def step_labels(correct_by_step: list[list[bool]]) -> tuple[list[Optional[int]], list[Optional[float]]]:
    """Hard (any right) and soft (share right) labels from each step's graded continuations;
    a step with none graded gets None for both.

    >>> step_labels([[True, False], [False, False], []])
    ([1, 0, None], [0.5, 0.0, None])
    """
    hard = [int(any(c)) if c else None for c in correct_by_step]
    soft = [sum(c) / len(c) if c else None for c in correct_by_step]
    return hard, soft


def _stream(settings: LabelSettings, task: str, index: int) -> torch.Generator:
    """The problem's own draws: the same whether or not earlier problems were labelled in this run."""
    return torch.Generator().manual_seed(zlib.crc32(f"{settings.seed}:{task}:{index}".encode()))


def _grade(metric: BatchReward, name: str, problem: Problem, texts: list[str]) -> list[Optional[bool]]:
    """Whether each text is right by the task's metric (None where its grader failed)."""
    rollouts = [Rollout(problem, [], [], [], text, "stop", 0) for text in texts]
    results = score_contained(metric, name, [problem] * len(texts), rollouts)
    return [None if r.error is not None else r.score >= 1 for r in results]


def label_problem(sampler: Any, task: Task, metric: BatchReward, index: int, settings: LabelSettings) -> list[dict]:
    """The records of one training problem: its solutions, each with its step labels."""
    problem = task.train_problem(index)
    tokenizer = sampler.tokenizer
    params = SamplingParams(temperature=settings.temperature, top_p=settings.top_p,
                            max_new_tokens=settings.max_new_tokens)
    draws = _stream(settings, task.name, index)
    start = prompt_ids(tokenizer, problem.prompt)
    solutions = [tokenizer.decode(ids, skip_special_tokens=True)
                 for ids, _, _ in sampler.sample([start] * settings.solutions, params, draws)]
    steps = [split_steps(text) for text in solutions]
    prefixes = [(s, "".join(line + "\n" for line in lines[:k + 1]))
                for s, lines in enumerate(steps) for k in range(len(lines) - 1)]
    rows = [start + tokenizer(prefix, add_special_tokens=False)["input_ids"] for _, prefix in prefixes
            for _ in range(settings.continuations)]
    texts = [prefixes[i // settings.continuations][1] + tokenizer.decode(ids, skip_special_tokens=True)
             for i, (ids, _, _) in enumerate(_sample_all(sampler, rows, params, draws))]
    graded = _grade(metric, task.metric, problem, texts + solutions)
    continued, own = graded[:len(texts)], graded[len(texts):]
    records = []
    for s, lines in enumerate(steps):
        mine = [i for i, (owner, _) in enumerate(prefixes) if owner == s]
        by_step = [[c for c in continued[i * settings.continuations:(i + 1) * settings.continuations] if c is not None]
                   for i in mine] + [[own[s]] if own[s] is not None and lines else []]
        hard, soft = step_labels(by_step[:len(lines)])
        errors = sum(c is None for i in mine for c in continued[i * settings.continuations:(i + 1) * settings.continuations])
        records.append({"task": task.name, "index": index, "sample": s, "prompt": problem.prompt,
                        "answer": problem.answer, "steps": lines, "hard": hard, "soft": soft,
                        "outcome": None if own[s] is None else int(own[s]), "continuations": settings.continuations,
                        "grader_errors": errors + (own[s] is None)})
    return records


def _sample_all(sampler: Any, rows: list[list[int]], params: SamplingParams, draws: torch.Generator) -> list:
    """``sampler.sample`` over ``rows`` in pieces of its batch size."""
    out: list = []
    size = max(1, getattr(sampler, "batch_size", len(rows)) or len(rows))
    for begin in range(0, len(rows), size):
        out += sampler.sample(rows[begin:begin + size], params, draws)
    return out


def _read_done(path: Path, header: dict) -> set[tuple[str, int]]:
    """The (task, index) pairs already in ``path``; a torn last line is cut off, a file written
    with other settings or a bad line elsewhere is a ConfigError naming it."""
    if not path.exists():
        return set()
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--out {path}: cannot be read to continue it ({exc})") from None
    complete = lines[:-1]  # every complete record ends with a newline; what follows the last is torn
    if lines[-1]:
        path.write_text("".join(line + "\n" for line in complete), encoding="utf-8")
    if not complete:
        return set()
    try:
        rows = [json.loads(line) for line in complete]
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--out {path}: not a labels file this command wrote ({exc.msg}); name a new file") from None
    if rows[0].get("prm_labels") != header["prm_labels"]:
        raise ConfigError(f"--out {path} was written with other settings ({rows[0].get('prm_labels')}); "
                          "run with the same ones to continue it, or name a new file")
    return {(row["task"], row["index"]) for row in rows[1:]}


def label(sampler: Any, tasks: list[Task], metrics: dict[str, BatchReward], out: Path, settings: LabelSettings,
          progress: bool = False) -> dict:
    """Label ``settings.problems`` training problems of each task into ``out`` (continuing a
    file this function started); returns counts of what the file holds."""
    settings.check()
    header = {"prm_labels": {k: v for k, v in asdict(settings).items() if k != "problems"}}
    done = _read_done(out, header)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        handle = out.open("a", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write it ({exc.strerror or exc})") from None
    todo = [(task, i) for task in tasks for i in range(settings.problems) if (task.name, i) not in done]
    with handle, tqdm(total=len(tasks) * settings.problems, initial=len(tasks) * settings.problems - len(todo),
                      desc="labelled", unit="problem", disable=not progress, dynamic_ncols=True) as bar:
        if out.stat().st_size == 0:
            handle.write(json.dumps(header) + "\n")
        for task, index in todo:
            records = label_problem(sampler, task, metrics[task.metric], index, settings)
            handle.write("".join(json.dumps(r) + "\n" for r in records))
            handle.flush()
            bar.update(1)
    return summarize(out)


def summarize(path: Path) -> dict:
    """Counts of a labels file: problems, solutions, labelled steps and their share of hard 1s."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[1:]]
    hard = [h for row in rows for h in row["hard"] if h is not None]
    outcomes = [row["outcome"] for row in rows if row["outcome"] is not None]
    return {"file": str(path), "problems": len({(r["task"], r["index"]) for r in rows}), "solutions": len(rows),
            "steps": len(hard), "positive_share": sum(hard) / len(hard) if hard else None,
            "solution_accuracy": sum(outcomes) / len(outcomes) if outcomes else None,
            "grader_errors": sum(r["grader_errors"] for r in rows)}


def label_from_config(config: TrainConfig, model_path: Optional[str], out: Path, settings: LabelSettings,
                      progress: bool) -> dict:
    """``temper prm label``: build the tasks, their metrics, the model and its sampler from the
    config, then :func:`label`."""
    from tempering.build import build_tasks
    from tempering.eval.greedy import build_metrics, close_metrics
    from tempering.policy import load_model
    from tempering.rollout.engines import build_sampler

    settings.check()
    played = [spec.name for spec in config.tasks if spec.env is not None]
    if played:
        raise ConfigError(f"tasks {', '.join(played)}: played in an environment; step labels need tasks answered "
                          "in one completion (pick others with --tasks)")
    set_torch_threads(config.threads or auto_threads())
    tasks = build_tasks(config)
    metrics = build_metrics(tasks, config.rewards.options)
    try:
        model, tokenizer, resolved = load_model(config, model_path or config.model.path, progress=progress)
        sampler = build_sampler(config, model, tokenizer, config.eval.batch_size)
        settings = LabelSettings(**{**asdict(settings), "model": resolved})
        try:
            return label(sampler, tasks, metrics, out, settings, progress)
        finally:
            if hasattr(sampler, "close"):
                sampler.close()
    finally:
        close_metrics(metrics)
