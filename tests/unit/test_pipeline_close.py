"""Closing a pipeline stops its reward worker and what that owns (the code reward's sandbox
pool), also when closing the sampler side fails first: the pool's worker processes must not
outlive the run. The pipeline is built from a config as ``temper train`` builds it, over the
miniature model, with the code reward's real one-slot executor."""

from __future__ import annotations

import pytest

from tempering.build import build_mixture, build_pipeline, build_rewarder, build_tasks
from tempering.config import TrainConfig
from tempering.policy import load_model


def _pipeline(tmp_path, model_dir):
    config = TrainConfig.model_validate({
        "model": {"path": str(model_dir)}, "threads": 1, "run_dir": str(tmp_path / "run"),
        "tasks": [{"name": "code"}], "rewards": {"options": {"code": {"workers": 1}}},
        "rollout": {"prompts_per_step": 1, "group_size": 2, "max_new_tokens": 8}})
    tasks = build_tasks(config)
    rewarder = build_rewarder(config, tasks)
    model, tokenizer, _ = load_model(config, config.model.path, progress=False)
    pipeline = build_pipeline(config, build_mixture(config, tasks), model, tokenizer, rewarder)
    pipeline.next_round()  # the code reward starts its pool on first use
    (executor,) = [reward.sandbox() for reward in rewarder.rewards.values()]
    workers = [slot.process for slot in executor._slots]
    assert workers and all(process.poll() is None for process in workers)
    return pipeline, workers


def test_close_stops_the_code_rewards_sandbox_workers(tmp_path, tiny_model_dir):
    pipeline, workers = _pipeline(tmp_path, tiny_model_dir)
    pipeline.close()
    assert all(process.poll() is not None for process in workers)


def test_a_sampler_that_fails_to_close_still_leaves_no_sandbox_worker(tmp_path, tiny_model_dir):
    pipeline, workers = _pipeline(tmp_path, tiny_model_dir)

    def refuse():  # as a launched server or an in-process engine may when stopped
        raise RuntimeError("the sampler could not be stopped")

    pipeline.rollout.generator.close = refuse
    with pytest.raises(RuntimeError, match="could not be stopped"):
        pipeline.close()
    assert all(process.poll() is not None for process in workers)
