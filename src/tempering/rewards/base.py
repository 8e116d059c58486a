"""The reward protocol, the registry, and the weighted combination of a task's rewards.

Two shapes of reward live in one registry, :data:`REWARDS`:

- a plain function ``fn(problem, completion) -> float`` (or ``-> RewardResult`` when it
  has named sub-scores or diagnostics). Decorate it with ``@register_reward(name,
  needs_rollout=True)`` to receive the :class:`~tempering.types.Rollout` instead of its
  text (for token counts). Keyword-only parameters are its options.
- a class whose instances have ``score_batch(problems, rollouts) -> list[RewardResult]``:
  for expensive rewards (the sandbox, a reward model) that hold resources and want the
  whole batch at once. Its constructor's keyword arguments are its options.

:func:`build_reward` turns either into a :class:`BatchReward`, so the composer treats
them alike and can run several at the same time. A user's own reward of either shape
plugs in as ``module:function`` (or ``module:Class``); one written for TRL or verl as
``trl:module:function`` or ``verl:module:function`` (:mod:`tempering.rewards.foreign`).

A :class:`RewardResult` with ``error`` set means the *grader* failed (a sandbox fault, a
verifier crash), not the answer: such a rollout is dropped from the batch and counted,
never scored as wrong.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, Protocol, Sequence, Union

from tempering.registry import add, resolve, typed_options
from tempering.types import Problem, RewardResult, Rollout

Number = Union[int, float]


RewardFn = Callable[[Problem, str], Union[Number, RewardResult]]


class BatchReward(Protocol):
    def score_batch(self, problems: Sequence[Problem], rollouts: Sequence[Rollout]) -> list[RewardResult]: ...


REWARDS: dict[str, Any] = {}


def register_reward(name: str, needs_rollout: bool = False) -> Callable[[Any], Any]:
    """Register a reward function or batch-reward class under ``name``."""
    flags = {"needs_rollout": True} if needs_rollout else {}
    return lambda reward: add(REWARDS, "reward", name, reward, **flags)


LAZY_REWARDS: dict[str, str] = {"humaneval": "tempering.tasks.humaneval:HumanEvalReward",
                                "reasoning_gym": "tempering.tasks.reasoning_gym:reasoning_gym_score"}
"""Rewards registered by the lazily imported tasks (``tempering.tasks.base.LAZY_TASKS``)."""


def _foreign(name: str) -> Optional[tuple[Any, Callable]]:
    """(adapter class, the user's function) of a ``trl:``/``verl:`` reward name, else None."""
    convention, _, target = name.partition(":")
    if ":" not in target:
        return None
    from tempering.rewards.foreign import ADAPTERS  # loaded on first use: it is rarely needed

    if convention not in ADAPTERS:
        return None
    return ADAPTERS[convention], resolve({}, target, "reward")


def resolve_reward(name: str) -> Any:
    """The registered reward ``name``, or its ``module:function``; for a ``trl:``/``verl:``
    name the adapter class that scores it (the user's function imported and checked)."""
    foreign = _foreign(name)
    return foreign[0] if foreign else resolve(REWARDS, name, "reward", LAZY_REWARDS, classes="score_batch")


def as_result(value: Union[Number, RewardResult]) -> RewardResult:
    return value if isinstance(value, RewardResult) else RewardResult(float(value))


class FunctionReward:
    """A plain reward function with its options bound, scored one rollout at a time."""

    def __init__(self, fn: Callable, name: str, options: dict[str, Any]):
        _check_options(fn, name, options)
        self.fn, self.options = fn, dict(options)
        self.needs_rollout = getattr(fn, "needs_rollout", False)
        self.summary = getattr(fn, "summary", ())

    def score_batch(self, problems: Sequence[Problem], rollouts: Sequence[Rollout]) -> list[RewardResult]:
        return [as_result(self.fn(p, r if self.needs_rollout else r.text, **self.options))
                for p, r in zip(problems, rollouts)]


def _check_options(fn: Callable, name: str, options: dict[str, Any]) -> None:
    """Refuse unknown options up front, naming the reward and what it accepts."""
    parameters = inspect.signature(fn).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    allowed = sorted(k for k, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY)
    unknown = sorted(set(options) - set(allowed))
    if unknown and not accepts_any:
        raise ValueError(f"reward {name!r} has no option {unknown[0]!r}; its options: {', '.join(allowed) or 'none'}")
    missing = [k for k in allowed if parameters[k].default is inspect.Parameter.empty and k not in options]
    if missing:
        raise ValueError(f"reward {name!r} needs the option {missing[0]!r} (rewards.options.{name}.{missing[0]})")


def build_reward(name: str, options: Optional[dict[str, Any]] = None) -> BatchReward:
    """The reward ``name`` with ``options`` bound, as something with ``score_batch``.

    A bad name or option is a ValueError that names it.
    """
    options = options or {}
    foreign = _foreign(name)
    if foreign:
        adapter, fn = foreign
        return adapter(fn, name, options)
    reward = resolve_reward(name)
    if inspect.isclass(reward):
        _check_options(reward.__init__, name, options)
        try:
            return reward(**_typed(reward.__init__, name, options))
        except TypeError as exc:
            raise ValueError(f"reward {name!r}: {exc}") from None
    if not callable(reward):
        raise ValueError(f"reward {name!r} is neither a function nor a class")
    return FunctionReward(reward, name, _typed(reward, name, options))


def _typed(fn: Callable, name: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` as ``fn``'s signature types them (:func:`~tempering.registry.typed_options`),
    a wrong type a ValueError naming the reward and the option."""
    try:
        return typed_options(fn, options)
    except ValueError as exc:
        raise ValueError(f"reward {name!r}: {exc}") from None


def score(problem: Problem, completion: str, spec: dict[str, float]) -> tuple[float, dict[str, float]]:
    """The weighted sum of the plain-function rewards in ``spec`` and each unweighted component.

    For one completion without options or batching; training goes through
    :class:`tempering.rewards.compose.Rewarder`.

    >>> from tempering.types import Problem
    >>> p = Problem(task="add", id="2+2", prompt="2+2\\n", answer="4")
    >>> score(p, "2+2=4\\nanswer: 4", {"exact_match": 1.0, "format": 0.1})
    (1.1, {'exact_match': 1.0, 'format': 1.0})
    """
    components = {}
    for name in spec:
        reward = resolve_reward(name)
        if inspect.isclass(reward) or getattr(reward, "needs_rollout", False):
            raise ValueError(f"reward {name!r} needs a rollout or a batch; score it with a Rewarder")
        components[name] = as_result(reward(problem, completion)).score
    total = sum(spec[name] * value for name, value in components.items())
    return total, components
