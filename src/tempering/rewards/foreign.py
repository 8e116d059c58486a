"""Reward functions written for TRL or verl, scored as they are.

A reward named ``trl:module:function`` or ``verl:module:function`` is the user's function
called the way that trainer calls it, so a reward file brought from either runs unchanged:

- ``trl:``: once per batch, ``function(prompts=[...], completions=[...], completion_ids=[...],
  **columns)``, each dataset column (``problem.meta``, less tempering's ``record``) a list with
  one entry per completion, as TRL's ``GRPOTrainer`` passes them. A completion is text, or
  ``[{"role": "assistant", "content": text}]`` when its prompt was chat messages. It returns
  one number per completion; ``None`` (TRL's "does not apply") scores 0 and is counted in
  ``diag/<name>/not_applicable``. An ``async def`` function is awaited.
- ``verl:``: once per completion, ``function(data_source=..., solution_str=completion,
  ground_truth=..., extra_info=...)`` from the record's ``data_source``,
  ``reward_model.ground_truth`` (else the problem's answer) and ``extra_info`` columns, as
  verl's ``custom_reward_function`` is called. It returns a number, or a dict with ``score``
  whose other numbers are logged as components (``reward/<name>/<key>``).

``rewards.options.<name>`` become extra keyword arguments of every call (verl's
``reward_kwargs``). A function that raises is contained like any reward: the rollouts it
failed on are dropped and counted in ``reward/errors``.

Not passed: TRL's ``trainer_state``, ``log_extra``, ``log_metric`` and ``environments``
(objects of its trainer), verl's batched ``compute_score`` form.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from typing import Any, Callable, Sequence

from tempering.types import Problem, RewardResult, Rollout


def _number(name: str, value: Any) -> float:
    if isinstance(value, numbers.Real):  # numpy's scalars too
        return float(value)
    raise TypeError(f"reward {name} returned {value!r}, not a number")


class TrlReward:
    """A TRL-style reward function over a batch (see the module docstring)."""

    def __init__(self, fn: Callable, name: str, options: dict[str, Any]):
        self.fn, self.name, self.options = fn, name, dict(options)

    def score_batch(self, problems: Sequence[Problem], rollouts: Sequence[Rollout]) -> list[RewardResult]:
        keys = list(dict.fromkeys(k for p in problems for k in p.meta if k != "record"))
        columns = {key: [p.meta.get(key) for p in problems] for key in keys}
        completions = [[{"role": "assistant", "content": r.text}] if isinstance(p.prompt, list) else r.text
                       for p, r in zip(problems, rollouts)]
        values = self.fn(prompts=[p.prompt for p in problems], completions=completions,
                         completion_ids=[list(r.completion_ids) for r in rollouts], **columns, **self.options)
        if inspect.isawaitable(values):
            values = asyncio.run(values)
        values = list(values)
        if len(values) != len(rollouts):
            raise ValueError(f"reward {self.name} returned {len(values)} values for {len(rollouts)} completions")
        return [RewardResult(0.0, diagnostics={"not_applicable": 1}) if v is None or _is_nan(v)
                else RewardResult(_number(self.name, v)) for v in values]


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


class VerlReward:
    """A verl-style ``compute_score`` function, one completion at a time (see the module docstring)."""

    def __init__(self, fn: Callable, name: str, options: dict[str, Any]):
        self.fn, self.name, self.options = fn, name, dict(options)

    def _one(self, problem: Problem, rollout: Rollout) -> RewardResult:
        reward_model = problem.meta.get("reward_model")
        truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
        value = self.fn(data_source=problem.meta.get("data_source"), solution_str=rollout.text,
                        ground_truth=problem.answer if truth is None else truth,
                        extra_info=problem.meta.get("extra_info"), **self.options)
        if not isinstance(value, dict):
            return RewardResult(_number(self.name, value))
        if "score" not in value:
            raise ValueError(f"reward {self.name} returned a dict without 'score' (keys: {', '.join(value)})")
        parts = {k: float(v) for k, v in value.items() if k != "score" and isinstance(v, numbers.Real)}
        return RewardResult(_number(self.name, value["score"]), components=parts)

    def score_batch(self, problems: Sequence[Problem], rollouts: Sequence[Rollout]) -> list[RewardResult]:
        return [self._one(p, r) for p, r in zip(problems, rollouts)]


ADAPTERS = {"trl": TrlReward, "verl": VerlReward}
"""The conventions a ``<convention>:module:function`` reward name may follow."""
