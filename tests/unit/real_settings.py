"""The learner settings a run of the default config gets, for unit tests that build a learner
by hand: they take a real run's path (packing, chunked log-probs, off-policy correction, ...)
unless they say otherwise, and a changed config default reaches them too."""

from __future__ import annotations

import dataclasses

from tempering.build import learner_settings, resolve_algorithm
from tempering.config import TrainConfig
from tempering.learner.step import LearnerSettings

_CONFIG = TrainConfig()
DEFAULT = learner_settings(_CONFIG, resolve_algorithm(_CONFIG), token_budget=0)


def run_settings(**fields) -> LearnerSettings:
    """The default run's settings with ``fields`` (LearnerSettings names) replaced."""
    return dataclasses.replace(DEFAULT, **fields)
