"""Reward-side normalization: per-domain running statistics, smoothing and clipping.

Group mean/std normalization is the advantage estimator's job (``algorithms/advantages.py``,
GRPO); it is not repeated here. What this adds is what a group cannot see: how a domain's
rewards run over many steps. That matters for estimators without a group baseline
(REINFORCE++, PPO with a critic) and for mixtures whose domains pay on different scales.

Per domain, in this order, on each step's rewards:

1. ``smoothing`` s in [0, 1): shrink each reward towards the domain's running mean,
   ``(1 - s) * r + s * mean``, which damps noisy rewards (a flaky grader, a noisy reward
   model) at the cost of some signal;
2. ``mode="ema"``: subtract the running mean and divide by the running std, both
   exponential moving averages (``decay`` per step, bias-corrected like Adam's moments),
   updated with this step's raw rewards first;
3. ``clip`` > 0: clamp to ``[-clip, clip]``.

The running moments are the whole state: :meth:`RunningNormalizer.state_dict` for checkpoints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional, Sequence


EPS = 1e-6
"""Added to the running std before dividing by it."""


@dataclass(frozen=True, kw_only=True)
class NormalizeSettings:
    """One domain's normalization; every field is required (``tempering.build.normalize_settings``
    fills them from the config)."""

    mode: Literal["none", "ema"]
    decay: float
    clip: float
    smoothing: float

    @property
    def active(self) -> bool:
        return self.mode != "none" or self.clip > 0 or self.smoothing > 0


class RunningNormalizer:
    """Per-domain running mean/std of rewards, applied as configured per domain.

    >>> norm = RunningNormalizer({"add": NormalizeSettings(mode="ema", decay=0.5, clip=0.0, smoothing=0.0)})
    >>> [round(x, 3) for x in norm("add", [0.0, 1.0])]
    [-1.0, 1.0]
    >>> [round(x, 3) for x in norm("sub", [0.0, 1.0])]  # no settings for sub: unchanged
    [0.0, 1.0]
    """

    def __init__(self, settings: dict[str, NormalizeSettings], default: Optional[NormalizeSettings] = None):
        """``settings`` per domain; ``default`` for the others (None: leave their rewards as they are)."""
        self.settings, self.default = dict(settings), default
        self.moments: dict[str, dict[str, float]] = {}

    def settings_for(self, domain: str) -> Optional[NormalizeSettings]:
        return self.settings.get(domain, self.default)

    def mean_std(self, domain: str) -> tuple[float, float]:
        m = self.moments[domain]
        correction = 1.0 - m["decay"] ** m["steps"]
        mean, square = m["first"] / correction, m["second"] / correction
        return mean, math.sqrt(max(square - mean * mean, 0.0))

    def update(self, domain: str, rewards: Sequence[float], decay: float) -> None:
        m = self.moments.setdefault(domain, {"first": 0.0, "second": 0.0, "steps": 0, "decay": decay})
        m["first"] = decay * m["first"] + (1 - decay) * sum(rewards) / len(rewards)
        m["second"] = decay * m["second"] + (1 - decay) * sum(r * r for r in rewards) / len(rewards)
        m["steps"] += 1

    def __call__(self, domain: str, rewards: Sequence[float]) -> list[float]:
        s = self.settings_for(domain)
        if s is None or not s.active or not rewards:
            return list(rewards)
        out = list(rewards)
        if s.smoothing > 0:
            prior = self.mean_std(domain)[0] if domain in self.moments else sum(out) / len(out)
            out = [(1 - s.smoothing) * r + s.smoothing * prior for r in out]
        self.update(domain, rewards, s.decay)
        if s.mode == "ema":
            mean, std = self.mean_std(domain)
            out = [(r - mean) / (std + EPS) for r in out]
        if s.clip > 0:
            out = [min(max(r, -s.clip), s.clip) for r in out]
        return out

    def state_dict(self) -> dict:
        return {"moments": {d: dict(m) for d, m in self.moments.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.moments = {d: dict(m) for d, m in state["moments"].items()}
