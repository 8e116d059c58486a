"""The reward registry and the weighted combination of a task's rewards."""

from __future__ import annotations

from typing import Callable

from tempering.tasks.base import resolve
from tempering.types import Problem

RewardFn = Callable[[Problem, str], float]
REWARDS: dict[str, RewardFn] = {}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    def decorator(fn: RewardFn) -> RewardFn:
        if name in REWARDS:
            raise ValueError(f"reward {name!r} is registered twice")
        REWARDS[name] = fn
        return fn

    return decorator


def resolve_reward(name: str) -> RewardFn:
    return resolve(REWARDS, name, "reward")


def score(problem: Problem, completion: str, spec: dict[str, float]) -> tuple[float, dict[str, float]]:
    """The weighted sum of the rewards in ``spec`` and each unweighted component.

    >>> from tempering.types import Problem
    >>> p = Problem(task="add", id="2+2", prompt="2+2\\n", answer="4")
    >>> score(p, "2+2=4\\nanswer: 4", {"exact_match": 1.0, "format": 0.1})
    (1.1, {'exact_match': 1.0, 'format': 1.0})
    """
    components = {name: float(resolve_reward(name)(problem, completion)) for name in spec}
    total = sum(spec[name] * value for name, value in components.items())
    return total, components
