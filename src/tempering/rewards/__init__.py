"""Rewards: outcome, process and preference rewards in one registry, composed per task.

A task names its rewards with weights (``Task.rewards``, overridable per task in the
config); :class:`Rewarder` scores a step's rollouts with them, every reward at once, and
keeps each component for logging; :class:`RewardMonitors` watches for reward hacking. A
reward is a plain function ``(problem, completion) -> float`` or a batch-scoring class (see
:mod:`tempering.rewards.base`); a user's own plugs in as ``module:function``.

Built in: ``exact_match``, ``match``, ``math`` (outcome); ``code`` (unit tests in the
sandbox); ``repo`` (an agent's patch to a repository, graded in a clean sandbox box); ``steps``, ``repetition``, ``format``, ``length``, ``consistency`` (process); ``exact_steps``, ``cited_match`` (outcome metrics that also report a process share); ``model`` (a reward
model, trained by ``temper rm train``); ``process_model`` (a process reward model scoring
each step, trained by ``temper prm train``).

Not here: the tasks themselves (the builder gives the :class:`Rewarder` each task's
:class:`TaskRewards`), the environments (their per-turn rewards arrive on a rollout's turns),
running programs (``tempering.sandbox``) and training a reward model (``tempering.rm``).
"""

from tempering.rewards.base import (REWARDS, BatchReward, RewardFn, RewardResult, build_reward,
                                    register_reward, resolve_reward, score)
from tempering.rewards import basic, code, consistency, maths, model, process, process_model, repo  # noqa: F401  (register the built-ins)
from tempering.rewards.compose import Rewarder, TaskRewards
from tempering.rewards.monitors import MonitorSettings, RewardMonitors
from tempering.rewards.normalize import NormalizeSettings, RunningNormalizer

__all__ = ["REWARDS", "BatchReward", "MonitorSettings", "NormalizeSettings", "RewardFn", "RewardMonitors",
           "RewardResult", "Rewarder", "RunningNormalizer", "TaskRewards", "build_reward", "register_reward",
           "resolve_reward", "score"]
