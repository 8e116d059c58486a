"""The task protocol and registry.

A task is a deterministic, indexable problem source: ``train_problem(i)`` is a pure function
of the task's seed and ``i``, so a data cursor is one integer and resuming is exact. The
held-out split never overlaps the training stream. A task also names the rewards that grade
it, with weights, so mixtures of tasks need no per-task code in the loop.

The built-in tasks also have ``state_dict()`` / ``load_state_dict()`` (:class:`StreamState`):
a small JSON-able dict with the stream's position (``next_index``, the index after the last
one served) and what else the stream depends on, so a checkpoint can save a task's stream and
a resumed run continue it exactly. The protocol does not require them: a task of your own
needs only ``train_problem`` and ``eval_problems``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from tempering.registry import add, resolve, typed_options
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


class StreamState:
    """``state_dict`` / ``load_state_dict`` for a task whose ``train_problem(i)`` is pure in (seed, i).

    The state is the seed and ``next_index``; a subclass adds what else its stream depends on
    (:meth:`_extra_state`, checked or restored by :meth:`_load_extra`). Loading a state saved
    from another seed is refused, because it would silently continue a different stream.
    """

    seed: int
    next_index: int = 0
    """The index after the last training problem served (0 before any)."""

    def _served(self, index: int) -> None:
        self.next_index = index + 1

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra(self, state: dict[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "next_index": self.next_index, **self._extra_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        name = getattr(self, "name", type(self).__name__)
        if state["seed"] != self.seed:
            raise ValueError(f"{name}: the saved stream has seed {state['seed']}, this task seed {self.seed}; "
                             "resume with the run's own seed")
        self._load_extra(state)
        self.next_index = int(state["next_index"])


GRADINGS = ("strict", "lenient")
"""How a task's answers are read (see ``tempering.rewards.basic``): only in the format the
prompt asks for, or as a reader would take them."""


def check_grading(grading: str) -> None:
    if grading not in GRADINGS:
        raise ValueError(f"grading must be 'strict' or 'lenient', got {grading!r}")


def render(template: str, **values: Any) -> str:
    """``template`` with its ``{placeholders}`` filled; a ValueError naming the ones there are."""
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError) as exc:
        *others, last = [f"{{{name}}}" for name in values]
        names = f"placeholders are {', '.join(others)} and {last}" if others else f"one placeholder is {last}"
        raise ValueError(f"template {template!r}: {exc!r}; the {names}") from None


TaskFactory = Callable[..., Task]
TASKS: dict[str, TaskFactory] = {}


def register_task(name: str) -> Callable[[TaskFactory], TaskFactory]:
    return lambda factory: add(TASKS, "task", name, factory)


LAZY_TASKS: dict[str, str] = {"rg:": "tempering.tasks.reasoning_gym:build_rg_task",
                              "code:": "tempering.tasks.code:build_code_task",
                              "humaneval": "tempering.tasks.humaneval:HumanEvalTask",
                              "long_context": "tempering.tasks.long_context:LongContextTask",
                              "long_context:": "tempering.tasks.long_context:LongContextTask",
                              "repo": "tempering.tasks.repo:build_repo_task"}
"""Task name, or ``prefix:`` for a family named on the fly (``rg:<type>``) -> ``module:factory``.
The module is imported when the first such task is built: some pull in heavy packages or
register their own rewards, which ``tempering.rewards`` cannot import at start-up without a
cycle (it imports this module)."""


def build_task(name: str, seed: int, **options: Any) -> Task:
    factory = resolve(TASKS, name, "task", LAZY_TASKS, classes=True)
    return factory(name=name, seed=seed, **typed_options(factory, options))
