"""Multi-turn environments: the protocol (:mod:`.base`), the episode runner (:mod:`.runner`),
and the built-in tool-use (:mod:`.tools`) and reflection (:mod:`.reflection`) environments."""

from tempering.envs.base import ENVS, Environment, Step, check_env, env_class, make_env, register_env

__all__ = ["ENVS", "Environment", "Step", "check_env", "env_class", "make_env", "register_env"]
