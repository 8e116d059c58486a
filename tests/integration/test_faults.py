"""Faults inside a run: non-finite steps are skipped, repeated ones roll back to the last
checkpoint, and a run without a checkpoint to return to stops with a clear error.

The steps are made non-finite by an advantage estimator that returns NaN, plugged in as a
user's estimator is: a reward that returns NaN no longer gets that far (the rewarder drops
its rollouts, naming the reward)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tempering.algorithms.advantages import grpo
from tempering.config import load_config


def nan_advantages(inputs) -> torch.Tensor:
    """Every advantage NaN: each step's loss and gradients are non-finite."""
    return torch.full_like(grpo(inputs), float("nan"))


def _config(tmp_path: Path, model_dir: Path, *extra: str):
    return load_config(None, ["steps=4", "threads=1", "rollout.prompts_per_step=2", "rollout.group_size=2",
                              "rollout.max_new_tokens=8", "eval.problems_per_task=2", "eval.max_new_tokens=8",
                              f"model.path={model_dir}", f"run_dir={tmp_path / 'run'}",
                              f"algorithm.advantage={__name__}:nan_advantages", *extra])


def test_non_finite_steps_are_skipped_then_rolled_back(tmp_path: Path, tiny_model_dir: Path):
    from tempering.train import train

    train(_config(tmp_path, tiny_model_dir, "checkpoint.every=1", "checkpoint.rollback_after=2"), progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped_updates"] for r in records] == [1, 1, 1, 1]
    assert [r.get("rollback_to") for r in records] == [None, 1, None, 3]


def test_repeated_non_finite_steps_without_a_checkpoint_stop_the_run(tmp_path: Path, tiny_model_dir: Path):
    from tempering.train import train

    with pytest.raises(RuntimeError, match="no checkpoint to roll back to"):
        train(_config(tmp_path, tiny_model_dir, "checkpoint.every=0", "checkpoint.rollback_after=2"), progress=False)
