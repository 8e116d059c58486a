"""Rollout samples: a share of each step's rollouts, as people read them, in ``samples.jsonl``.

Metrics say how a run is going; samples say what the model actually wrote. Each line is one
rollout the learner trained on: its step, task, domain, prompt, completion (for a multi-turn
episode the whole transcript, and its turns one by one), reward and reward parts as the
learner saw them (after shaping), finish reason, completion tokens and the policy version
that sampled it.

Which rollouts are kept depends only on the run's seed, the step and how many rollouts the
step trained on, so a resumed run writes the same lines an uninterrupted one would; the file
is cut back to the checkpoint's step on resume like ``metrics.jsonl``. Not kept: token ids,
log-probs and advantages (the checkpoint and the learner own those).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from tempering.types import Group, Rollout, transcript


def chosen(count: int, share: float, seed: int, step: int) -> list[int]:
    """Indices of the ``count`` rollouts kept at ``step``: ``share`` of them rounded up (none
    when ``share`` is 0), drawn by a generator seeded with the run's seed and the step.

    >>> chosen(8, 0.25, seed=0, step=1) == chosen(8, 0.25, seed=0, step=1)
    True
    >>> len(chosen(8, 0.25, seed=0, step=1)), chosen(8, 0.0, seed=0, step=1), chosen(3, 1.0, seed=0, step=1)
    (2, [], [0, 1, 2])
    """
    keep = min(count, math.ceil(share * count))
    return sorted(random.Random(f"samples/{seed}/{step}").sample(range(count), keep))


def sample_record(step: int, rollout: Rollout) -> dict[str, Any]:
    """One rollout as a ``samples.jsonl`` line (see the module docstring)."""
    problem = rollout.problem
    record = {
        "step": step, "task": problem.task, "domain": problem.domain_key, "id": problem.id,
        "prompt": problem.prompt, "answer": problem.answer, "completion": transcript(rollout),
        "reward": rollout.reward, "reward_parts": dict(rollout.reward_components),
        "finish_reason": rollout.finish_reason, "completion_tokens": len(rollout.completion_ids),
        "policy_version": rollout.policy_version,
    }
    if rollout.turns:
        record["turns"] = [{"text": t.text, "finish_reason": t.finish_reason, "observation": t.observation,
                            "rewards": dict(t.rewards), "info": dict(t.info)} for t in rollout.turns]
    return record


class SampleWriter:
    """Appends the chosen rollouts of each step to ``samples.jsonl`` and flushes, so a killed
    run keeps every step it logged; with ``share`` 0 it writes nothing and creates no file."""

    def __init__(self, path: Path, share: float, seed: int):
        self.path, self.share, self.seed = path, share, seed
        self._file = path.open("a", encoding="utf-8") if share > 0 else None

    def write(self, step: int, groups: list[Group]) -> None:
        if self._file is None:
            return
        rollouts = [r for g in groups for r in g.rollouts]
        for index in chosen(len(rollouts), self.share, self.seed, step):
            self._file.write(json.dumps(sample_record(step, rollouts[index]), default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
