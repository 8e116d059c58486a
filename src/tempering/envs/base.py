"""The environment protocol: multi-turn episodes around a task's problems.

An environment turns one problem into an episode: :meth:`Environment.reset` gives the first
prompt, the model answers, :meth:`Environment.step` reads the answer and says what comes back
(a tool's result, a failing test), what the turn earned, and whether the episode is over. One
environment object serves one episode; ``tempering.envs.runner`` makes one per rollout.

The runner, not the environment, handles tokens: what the model sampled stays exactly the
ids it drew, and what the environment says back is encoded once and inserted as ids that the
learner never trains on (``loss_mask`` 0). An environment sees text only.

An observation is either

- a string, appended right after the model's turn as it is (an inline tool result: the model
  wrote ``<calc>47*6</calc>``, the runner stopped it there, and ``<result>282</result>`` is
  inserted; the model then continues the same turn), or
- chat messages (``{"role": "user" | "tool", "content": ...}``), new turns rendered with the
  tokenizer's chat template after the model's turn is closed the way the template closes it;
  without a chat template, their contents one per line.

A turn ends at end-of-sequence, at one of the environment's ``stop`` strings (kept in the
turn), or at the token budget; a turn cut off by the budget ends the episode without a step.
The task's own rewards grade the episode's last model turn (``Rollout.text``); the rewards a
step returns are added to them, each as ``env/<name>`` (per-turn rewards summed over the
episode, which is the one return GRPO and its kin use). ``Step.info`` holds counters (tool
calls, tool errors) summed per episode and logged per training step as ``env/<name>``.

A user's environment plugs in by ``module:Class`` in a task's ``env.name``; the class is called
with the ``env.options`` (and ``tokenizer=`` when its ``__init__`` takes one).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Union, runtime_checkable

from tempering.registry import add, resolve
from tempering.types import Messages, Problem, Prompt

Observation = Union[str, Messages, None]


@dataclass
class Step:
    """What an environment says after one model turn."""

    observation: Observation = None
    """Inserted before the model's next turn (see the module docstring); None with ``done``."""
    rewards: dict[str, float] = field(default_factory=dict)
    """This turn's reward parts, added to the episode's reward as ``env/<name>``."""
    done: bool = False
    info: dict[str, float] = field(default_factory=dict)
    """Counters for logging (``tool_calls``, ``tool_errors``), summed over the episode."""


@runtime_checkable
class Environment(Protocol):
    stop: tuple[str, ...]
    """Strings that end a model turn so the environment can act (``</calc>``); may be empty or
    left out."""

    def reset(self, problem: Problem) -> Prompt:
        """The episode's first prompt (text or chat messages); usually ``problem.prompt``."""
        ...

    def step(self, completion: str) -> Step:
        """React to the model's latest turn (its text, stop string included)."""
        ...


ENVS: dict[str, Any] = {}
_LAZY = {
    "tools": "tempering.envs.tools:ToolEnv",
    "reflection": "tempering.envs.reflection:ReflectionEnv",
    "repo": "tempering.envs.repo:RepoEnv",
}


def register_env(name: str):
    """Decorator: register an environment class under ``name``."""
    return lambda cls: add(ENVS, "environment", name, cls)


def env_class(name: str) -> Any:
    """The environment class registered (or importable as ``module:Class``) under ``name``."""
    return resolve(ENVS, name, "environment", lazy=_LAZY, classes="step")


def make_env(name: str, options: dict[str, Any], tokenizer: Optional[Any] = None) -> Environment:
    """A fresh environment for one episode; ``tokenizer`` goes to classes that take one."""
    cls = env_class(name)
    if tokenizer is not None and "tokenizer" in inspect.signature(cls).parameters:
        options = {**options, "tokenizer": tokenizer}
    return cls(**options)


def check_env(name: str, options: dict[str, Any]) -> None:
    """Refuse an unknown environment, options its class does not take, or values its
    ``check_options(**options)`` (a class's own static check, when it has one) refuses: a
    ValueError, before any episode is played."""
    cls = env_class(name)
    signature = inspect.signature(cls)
    try:
        signature.bind(**options, **({"tokenizer": None} if "tokenizer" in signature.parameters else {}))
    except TypeError as exc:
        raise ValueError(f"environment {name!r}: {exc}") from None
    check = getattr(cls, "check_options", None)
    if callable(check):
        check(**options)
