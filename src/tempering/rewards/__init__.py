"""Rewards: small pure functions ``(problem, completion) -> float`` in a registry.

A task names its rewards with weights; :func:`score` combines them into the scalar the
advantage estimator sees and keeps each component for logging. A user's own reward plugs
in as ``module:function`` with the same signature.
"""

from tempering.rewards.base import REWARDS, RewardFn, register_reward, resolve_reward, score
from tempering.rewards import basic  # noqa: F401  (registers the built-in rewards)

__all__ = ["REWARDS", "RewardFn", "register_reward", "resolve_reward", "score"]
