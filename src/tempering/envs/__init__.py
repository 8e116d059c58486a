"""Multi-turn environments: the protocol (:mod:`.base`), the episode runner (:mod:`.runner`),
the built-in tool-use (:mod:`.tools`) and reflection (:mod:`.reflection`) environments, and
agents of a user's own played through a recording proxy (:mod:`.agent`, :mod:`.recording`).

Not here: sampling (the runner wraps a generator and keeps its exact tokens), grading an
episode's final answer (the task's rewards do), or training on it (episodes are rollouts).
"""

from tempering.envs.base import ENVS, Environment, Step, check_env, env_class, make_env, register_env

__all__ = ["ENVS", "Environment", "Step", "check_env", "env_class", "make_env", "register_env"]
