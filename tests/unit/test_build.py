"""The config -> objects seam: settings come only from the config, workers take any generator,
and the pipeline does not depend on the loop or the config."""

import dataclasses
import subprocess
import sys

import pytest
import torch

from tempering.build import learner_settings, monitor_settings, normalize_settings, resolve_algorithm, scheduler_settings
from tempering.config import TrainConfig
from tempering.learner import LearnerSettings
from tempering.pipeline import RolloutWorker
from tempering.rewards import MonitorSettings, NormalizeSettings
from tempering.rollout.base import Generator, SamplingParams
from tempering.scheduler import Settings
from tempering.types import Group, Problem, Rollout


@pytest.mark.parametrize("settings_class", [LearnerSettings, Settings, MonitorSettings, NormalizeSettings])
def test_settings_have_no_defaults_of_their_own(settings_class):
    defaulted = [f.name for f in dataclasses.fields(settings_class)
                 if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]
    assert defaulted == [], "a default here could drift from the config's"


def test_learner_settings_carry_the_configs_values():
    config = TrainConfig.model_validate({
        "algorithm": {"kl_horizon": 7, "norm_length": 0, "kl_estimator": "k3+", "kl_clamp": 10}, "learner": {"packing": False, "logprob_chunk": 33},
        "pipeline": {"off_policy": "decoupled", "is_cap": 1.5}, "rollout": {"max_new_tokens": 40}})
    settings = learner_settings(config, resolve_algorithm(config), token_budget=123)
    assert (settings.kl_horizon, settings.packing, settings.logprob_chunk) == (7, False, 33)
    assert (settings.kl_estimator, settings.kl_clamp) == ("k3+", 10)
    assert (settings.off_policy, settings.is_cap, settings.token_budget) == ("decoupled", 1.5, 123)
    assert settings.norm_length == 40, "norm_length 0 means the completion limit"
    default = TrainConfig()
    plain = learner_settings(default, resolve_algorithm(default), token_budget=0)
    assert (plain.kl_horizon, plain.packing, plain.logprob_chunk, plain.off_policy) == (
        default.algorithm.kl_horizon, default.learner.packing, default.learner.logprob_chunk,
        default.pipeline.off_policy)


def test_the_smaller_settings_are_the_config_sections():
    config = TrainConfig.model_validate({"scheduler": {"floor": 0.3}, "rewards": {
        "monitors": {"window": 4}, "normalize": {"mode": "ema", "decay": 0.5}}})
    assert scheduler_settings(config.scheduler).floor == 0.3
    assert monitor_settings(config.rewards.monitors).window == 4
    assert normalize_settings(config.rewards.normalize) == NormalizeSettings(mode="ema", decay=0.5, clip=0.0,
                                                                             smoothing=0.0)


def test_the_pipeline_imports_neither_the_loop_nor_the_config():
    code = ("import sys, tempering.pipeline; "
            "print(sorted(m for m in ('tempering.train', 'tempering.build', 'tempering.config') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


class Echo:
    """A generator that is not a Hugging Face model: it answers every problem with its answer."""

    def __init__(self):
        self.weights = []

    def generate(self, problems, group_size, params, policy_version=0, generator=None):
        draws = torch.rand(len(problems) * group_size, generator=generator).tolist()
        return [Group(p, [Rollout(p, [1], [2], [-draws[i * group_size + j]], p.answer, "stop", policy_version)
                          for j in range(group_size)]) for i, p in enumerate(problems)]

    def load_weights(self, weights):
        self.weights.append(weights)


def test_the_rollout_worker_samples_through_any_generator():
    echo = Echo()
    assert isinstance(echo, Generator)
    worker = RolloutWorker(echo, SamplingParams(), group_size=3, seed=5)
    worker.set_weights({"w": torch.zeros(1)}, version=4)
    groups = worker.sample([Problem(task="t", id="0", prompt="q", answer="42")])
    assert echo.weights and list(echo.weights[0]) == ["w"]
    assert [r.text for r in groups[0].rollouts] == ["42"] * 3
    assert {r.policy_version for r in groups[0].rollouts} == {4}
    again = RolloutWorker(Echo(), SamplingParams(), group_size=3, seed=5)
    again.version = 4
    assert [r.logprobs for r in again.sample([groups[0].problem])[0].rollouts] == \
        [r.logprobs for r in groups[0].rollouts], "the worker's own seeded stream drives the draws"


def test_the_hf_sampler_is_a_generator(tiny_policy):
    from tempering.rollout.hf import HFGenerator

    model, tokenizer = tiny_policy
    assert isinstance(HFGenerator(model, tokenizer), Generator)
