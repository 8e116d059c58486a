"""tempering: reinforcement-learning post-training with verifiable rewards.

The folders follow one RL step: ``rollout`` samples, ``rewards`` scores (``envs`` plays
multi-turn episodes, ``tasks`` supplies problems and names their rewards), ``learner`` turns a
scored batch into new weights; ``eval`` and ``reporting`` stand beside the loop, and
``algorithms`` (maths on tensors), ``models`` and ``sandbox`` below it. At the top are the
commands (``train``, ``sft``, ``pretrain``, ``rm``, ``eval_model``, ``serve_model``,
``explain``; ``cli`` parses their arguments), the one builder from config to objects
(``build``), what joins the parts of a run (``scheduler``, ``pipeline``, ``placement``,
``checkpoint``) and the foundations every part may use (``config``, ``types``, ``registry``,
``faults``, ``threads``). Imports run only down that order, which ``tests/unit/test_layers.py``
checks.

The public Python API, importable from here (``from tempering import train``)::

    summary = train({"steps": 20, "tasks": [{"name": "add"}]})
    result = evaluate(summary["checkpoint"], tasks=["add", "mul"])

    @register_reward("shorter")
    def shorter(problem: Problem, completion: str) -> float:
        return 1.0 if len(completion) < 80 else 0.0

These names are the stable surface; everything else is reachable by module but may change.
They are imported on first use, so ``import tempering`` loads neither torch nor transformers
(``tests/unit/test_api.py`` holds the list and the import's cost). :data:`EXPORTS` is the one
table of where each name lives.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tempering.torch_extensions import hide_cuda_extensions

__version__ = "0.1.0"

hide_cuda_extensions()  # before anything imports transformers

EXPORTS: dict[str, str] = {
    # the commands as functions
    "train": "tempering.api", "evaluate": "tempering.api", "load_model": "tempering.api",
    "run_code": "tempering.api", "load_config": "tempering.api",
    # configuration
    "TrainConfig": "tempering.config", "ConfigError": "tempering.config",
    # the data a step moves, and what plug-ins take and return
    "Problem": "tempering.types", "Rollout": "tempering.types", "RewardResult": "tempering.rewards.base",
    "Task": "tempering.tasks.base", "Environment": "tempering.envs.base", "Step": "tempering.envs.base",
    "AdvantageInputs": "tempering.algorithms.advantages", "LossInputs": "tempering.algorithms.losses",
    # registration by decorator (each also plugs in as module:name in a config)
    "register_reward": "tempering.rewards.base", "register_task": "tempering.tasks.base",
    "register_advantage": "tempering.algorithms.advantages", "register_loss": "tempering.algorithms.losses",
    "register_env": "tempering.envs.base",
    # the sandbox as a library
    "Executor": "tempering.sandbox", "RunRequest": "tempering.sandbox", "RunResult": "tempering.sandbox",
    "Limits": "tempering.sandbox", "TestSpec": "tempering.sandbox", "SandboxUnavailable": "tempering.sandbox",
}
"""Public name -> the module it is defined in."""

__all__ = ["__version__", *EXPORTS]


def __getattr__(name: str) -> Any:
    module = EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tempering' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(EXPORTS))


class _Package(ModuleType):
    """Keeps ``tempering.train`` and ``tempering.evaluate`` the API's functions once the
    submodules of those names are imported (the import system sets a submodule as an attribute
    of its package); the submodules stay importable by name (``from tempering.train import ...``),
    but ``import tempering.train as m`` binds the function."""

    def __setattr__(self, name: str, value: Any) -> None:
        if not (name in EXPORTS and isinstance(value, ModuleType)):
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


if TYPE_CHECKING:  # the same names for type checkers and editors, which do not run __getattr__
    from tempering.algorithms.advantages import AdvantageInputs, register_advantage
    from tempering.algorithms.losses import LossInputs, register_loss
    from tempering.api import evaluate, load_config, load_model, run_code, train
    from tempering.config import ConfigError, TrainConfig
    from tempering.envs.base import Environment, Step, register_env
    from tempering.rewards.base import RewardResult, register_reward
    from tempering.sandbox import Executor, Limits, RunRequest, RunResult, SandboxUnavailable, TestSpec
    from tempering.tasks.base import Task, register_task
    from tempering.types import Problem, Rollout
