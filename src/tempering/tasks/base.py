"""The task protocol and registry.

A task is a deterministic, indexable problem source: ``train_problem(i)`` is a pure function
of the task's seed and ``i``, so a data cursor is one integer and resuming is exact. The
held-out split never overlaps the training stream. A task also names the rewards that grade
it, with weights, so mixtures of tasks need no per-task code in the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from tempering.registry import add, resolve
from tempering.types import Problem


@runtime_checkable
class Task(Protocol):
    name: str
    domain: str
    rewards: dict[str, float]
    """Reward name (a key of ``tempering.rewards.REWARDS`` or ``module:function``) -> weight."""
    metric: str
    """The reward whose value (0 or 1) counts as 'correct' for accuracy."""

    def train_problem(self, index: int) -> Problem: ...

    def eval_problems(self, n: int) -> list[Problem]: ...


TaskFactory = Callable[..., Task]
TASKS: dict[str, TaskFactory] = {}


def register_task(name: str) -> Callable[[TaskFactory], TaskFactory]:
    return lambda factory: add(TASKS, "task", name, factory)


LAZY_TASKS: dict[str, str] = {"rg:": "tempering.tasks.reasoning_gym:build_rg_task",
                              "humaneval": "tempering.tasks.humaneval:HumanEvalTask",
                              "long_context": "tempering.tasks.long_context:LongContextTask"}
"""Task name, or ``prefix:`` for a family named on the fly (``rg:<type>``) -> ``module:factory``.
The module is imported when the first such task is built: some pull in heavy packages or
register their own rewards, which ``tempering.rewards`` cannot import at start-up without a
cycle (it imports this module)."""


def build_task(name: str, seed: int, **options: Any) -> Task:
    prefix, colon, _ = name.partition(":")
    lazy = LAZY_TASKS.get(prefix + colon if colon else name)
    factory = resolve({}, lazy, "task") if lazy else resolve(TASKS, name, "task")
    return factory(name=name, seed=seed, **options)
