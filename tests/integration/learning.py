"""Helpers for the tests that show RL learns: the two broken estimators that are their
negative controls, plugged in through ``algorithm.advantage: module:function`` as a user's
estimator would be, and the check of a run's lift in mean reward. Not a test module.

The controls differ from GRPO only in the sign or the size of the signal: a run with the
policy-gradient direction reversed, or with no advantage at all, must not learn.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tempering.algorithms.advantages import grpo
from tempering.config import TrainConfig, builtin_config, load_config
from tempering.pretrain import ensure_pretrained
from tempering.reporting.metrics import read_jsonl
from tempering.train import train

CONTROLS = [("grpo", True), (f"{__name__}:flipped", False), (f"{__name__}:zeroed", False)]
"""``(algorithm.advantage, whether the run must learn)`` for a parametrised test."""


def flipped(inputs) -> torch.Tensor:
    """GRPO's advantages with the sign reversed: every update moves away from reward."""
    return -grpo(inputs)


def zeroed(inputs) -> torch.Tensor:
    """No advantage: the policy-gradient term carries nothing."""
    return torch.zeros_like(grpo(inputs))


def run_metrics(settings: dict, advantage: str, tmp_path: Path) -> list[dict]:
    """Every step's metrics record of a run of ``settings`` with ``advantage`` as its estimator."""
    run_dir = tmp_path / advantage.replace(":", "_")
    train(TrainConfig.model_validate({**settings, "algorithm": {"advantage": advantage}, "run_dir": str(run_dir)}),
          progress=False)
    return read_jsonl(run_dir / "metrics.jsonl")


def pretrained_config(name: str) -> TrainConfig:
    """A shipped config, its model pre-trained (into the session's cache) so a run starts at once."""
    config = load_config(builtin_config(name))
    ensure_pretrained(config.pretrain, progress=False)
    return config


def run_summary(config: TrainConfig, advantage: str, run_dir: Path) -> dict:
    """The summary of a run of ``config`` with ``advantage`` as its estimator (the rest of its
    algorithm kept), writing no checkpoints."""
    settings = config.model_dump(mode="json")
    settings.update(run_dir=str(run_dir), algorithm={**settings["algorithm"], "advantage": advantage},
                    checkpoint={"every": 0})
    return train(TrainConfig.model_validate(settings), progress=False)


def check_lift(rewards: list[float], learns: bool, margin: float, head: int, tail: int) -> None:
    """The mean reward of the last ``tail`` steps exceeds the first ``head`` steps' by more than
    ``margin`` when the run ``learns``, and by less than half of it when it must not."""
    lift = sum(rewards[-tail:]) / tail - sum(rewards[:head]) / head
    if learns:
        assert lift > margin, f"mean reward moved by {lift:+.3f} (need > {margin}): {rewards}"
    else:
        assert lift < margin / 2, f"a broken signal still moved the reward by {lift:+.3f}: {rewards}"
