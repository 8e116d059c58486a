"""The algorithm and learner config: every variant selectable by name, bounds checked where the
config is built, combinations refused before any work, and the learner built as configured."""

import warnings

import pytest

from tempering.algorithms import ADVANTAGES, AGGREGATIONS, LOSSES
from tempering.build import build_learner, resolve_algorithm
from tempering.config import ConfigError, load_config
from tempering.learner.step import Learner
from tempering.models.tiny import build_model


@pytest.mark.parametrize("key, names", [
    ("advantage", ["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"]),
    ("loss", ["ppo_clip", "dual_clip", "gspo", "cispo", "reinforce"]),
    ("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "token_sum_norm"]),
])
def test_every_registered_variant_resolves_by_name(key, names):
    registry = {"advantage": ADVANTAGES, "loss": LOSSES, "aggregation": AGGREGATIONS}[key]
    for name in names:
        assert resolve_algorithm(load_config(None, [f"algorithm.{key}={name}"]))[key] is registry[name]


@pytest.mark.parametrize("override, expected", [
    ("learner.ppo_epochs=0", "learner.ppo_epochs=0: Input should be greater than or equal to 1"),
    ("learner.mini_batches=0", "learner.mini_batches=0"),
    ("algorithm.gamma=1.5", "algorithm.gamma=1.5: Input should be less than or equal to 1 (discount per token"),
    ("algorithm.lam=-0.1", "algorithm.lam=-0.1"),
    ("algorithm.clip_low=1.5", "algorithm.clip_low=1.5"),
    ("algorithm.dual_clip=1", "algorithm.dual_clip=1: Input should be greater than 1"),
    ("algorithm.critic=mlp", "algorithm.critic='mlp': Input should be 'head' or 'model'"),
    ("algorithm.max_extra_rounds=1000", "algorithm.max_extra_rounds=1000"),
    ("algorithm.entropy_coef=-1", "algorithm.entropy_coef=-1"),
    ("algorithm.nosuch=1", "algorithm.nosuch: unknown key (allowed here: advantage, aggregation, clip_high"),
])
def test_out_of_range_values_are_config_errors_naming_the_key(override, expected):
    with pytest.raises(ConfigError) as caught:
        load_config(None, [override])
    assert expected in str(caught.value)


@pytest.mark.parametrize("overrides, expected", [
    (["algorithm.overlong_buffer=49", "rollout.max_new_tokens=48"],
     "algorithm.overlong_buffer=49: must not exceed rollout.max_new_tokens=48"),
    (["algorithm.kl_target=0.01"],
     "algorithm.kl_target: an adaptive KL coefficient needs a starting algorithm.kl_coef > 0"),
])
def test_settings_that_do_not_fit_together_are_refused_by_resolve_algorithm(overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        resolve_algorithm(load_config(None, overrides))


def _tiny():
    return build_model(vocab_size=12, hidden_size=16, layers=1, heads=2, max_positions=16, seed=0,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _build(*overrides) -> Learner:
    config = load_config(None, list(overrides))
    return build_learner(_tiny(), config, resolve_algorithm(config))


def test_the_default_learner_has_no_critic_no_reference_and_one_update_per_batch():
    learner = _build()
    assert learner.critic is None and learner.reference is None
    s = learner.settings
    assert (s.ppo_epochs, s.mini_batches, s.entropy_coef, s.kl_in_reward) == (1, 1, 0.0, False)
    assert s.norm_length == 48, "token_sum_norm's constant defaults to the quickstart's rollout.max_new_tokens"


def test_gae_builds_the_configured_critic_and_adds_it_to_the_optimizer():
    head = _build("algorithm.advantage=gae")
    assert head.critic is not None and head.critic.shared
    assert len(head.optimizer.param_groups) == 2
    model = _build("algorithm.advantage=gae", "algorithm.critic=model")
    assert not model.critic.shared
    assert _build("algorithm.critic=model").critic is None, "only an estimator that needs values gets a critic"


def test_a_reference_model_exists_only_with_a_positive_kl_coefficient():
    assert _build("algorithm.kl_in_reward=true").reference is None
    assert _build("algorithm.kl_coef=0.1", "algorithm.kl_in_reward=true").reference is not None


@pytest.mark.parametrize("overrides", [
    ["algorithm.advantage=gae"],
    ["algorithm.advantage=distill", "algorithm.teacher.path=builtin:tiny"],
    ["algorithm.advantage=reinforce_pp", "algorithm.gamma=0.9"],
    ["algorithm.advantage=reinforce_pp", "algorithm.kl_coef=0.1", "algorithm.kl_in_reward=true"],
])
def test_gspo_with_advantages_that_vary_along_a_sequence_resolves_without_a_warning(overrides):
    # GSPO-token keeps each token's advantage (tests/unit/test_losses.py), so there is nothing to warn of
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = resolve_algorithm(load_config(None, ["algorithm.loss=gspo", *overrides]))
    assert found["loss"] is LOSSES["gspo"]
