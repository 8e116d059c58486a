"""Which problems to train on next: a weighted mixture over tasks with per-task cursors.

Each task's training stream is indexable (``task.train_problem(i)``), so the scheduler's
whole state is one cursor per task plus its random generator: ``state_dict()`` captures
it and a resumed run draws exactly the same problems.

Not done here: adaptive weights and curricula (the mixture is static).
"""

from __future__ import annotations

import random
from typing import Sequence

from tempering.tasks import Task
from tempering.types import Problem


class StaticMixture:
    """Draws each problem's task with probability proportional to its weight."""

    def __init__(self, tasks: Sequence[Task], weights: Sequence[float], seed: int):
        if len(tasks) != len(weights):
            raise ValueError("one weight per task is needed")
        if not any(w > 0 for w in weights):
            raise ValueError("at least one task needs a positive training weight")
        self.tasks = list(tasks)
        self.weights = list(weights)
        self.cursors = {task.name: 0 for task in tasks}
        self.rng = random.Random(seed)

    def next_problems(self, n: int) -> list[Problem]:
        chosen = self.rng.choices(self.tasks, weights=self.weights, k=n)
        problems = []
        for task in chosen:
            problems.append(task.train_problem(self.cursors[task.name]))
            self.cursors[task.name] += 1
        return problems

    def state_dict(self) -> dict:
        return {"cursors": dict(self.cursors), "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self.cursors = dict(state["cursors"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
