"""RL maths as registries of plain functions on tensors: advantage estimators, policy losses,
loss aggregation modes, KL estimators and their adaptive coefficient, DAPO's dynamic sampling
and overlong shaping, the critic's value loss, log-probs from logits, and the whole objective
that the learner differentiates (``objective.py``). Variants are added as new registry
entries; the loop selects them by name from the config.

Not here: running a model (``tempering.learner.forward``, the critic's value head in
``tempering.learner.critic``), modules with parameters (``torch.nn`` layers), optimizer steps
(``tempering.learner``), or reading a config (``tempering.build`` passes plain values).
"""

from tempering.algorithms.advantages import ADVANTAGES, AdvantageInputs, register_advantage
from tempering.algorithms.kl import KL_ESTIMATORS, kl_estimate
from tempering.algorithms.losses import AGGREGATIONS, LOSSES, LossInputs, register_aggregation, register_loss
from tempering.algorithms import online_dpo  # noqa: F401  (registers best_worst and online_dpo)

__all__ = [
    "ADVANTAGES", "AGGREGATIONS", "AdvantageInputs", "KL_ESTIMATORS", "LOSSES", "LossInputs",
    "kl_estimate", "register_advantage", "register_aggregation", "register_loss",
]
