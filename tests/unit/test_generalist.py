"""builtin:generalist: one list of domains behind its corpus and the shipped joint config, a
fixed recipe, and the model name understood wherever a built-in model is."""

import pytest

from tempering import generalist
from tempering.config import ConfigError, PretrainConfig, load_config
from tempering.policy import BUILTIN_MODELS, check_builtin_name
from tempering.pretrain import builtin_pretrain, cached_model_dir


def test_the_joint_config_trains_the_generalists_domains_with_their_options():
    config = load_config("joint")
    assert config.model.path == "builtin:generalist"
    trained = [(t.name, t.options) for t in config.tasks]
    assert trained == [(t.name, t.options) for t in generalist.domains()]
    assert sorted(sum(generalist.GROUPS.values(), [])) == sorted(name for name, _ in trained)


def test_the_recipe_writes_every_domain_and_at_least_six_reasoning_gym_types():
    recipe = generalist.recipe()
    assert [t.name for t in recipe.tasks] == [t.name for t in generalist.domains()]
    assert len(generalist.GROUPS["reasoning"]) >= 6 and all(generalist.GROUPS.values())
    assert recipe != PretrainConfig()


def test_the_generalist_has_its_own_cache_entry_whatever_the_pretrain_section_says():
    tiny = PretrainConfig()
    assert builtin_pretrain("builtin:tiny", tiny) is tiny
    assert builtin_pretrain("builtin:generalist", tiny) == generalist.recipe()
    assert cached_model_dir(generalist.recipe()) != cached_model_dir(tiny)
    check_builtin_name("builtin:generalist")
    assert "builtin:generalist" in BUILTIN_MODELS


def test_a_pretrain_section_beside_the_generalist_is_a_config_error():
    with pytest.raises(ConfigError, match="builtin:generalist is pre-trained by its fixed recipe"):
        load_config("joint", ["pretrain.steps=5"])
    assert load_config("joint", ["model.path=builtin:tiny", "pretrain.steps=5"]).pretrain.steps == 5


def test_explain_says_the_generalist_is_not_pre_trained_yet(tmp_path, monkeypatch):
    from tempering.explain import inspect_model

    monkeypatch.setenv("TEMPERING_CACHE", str(tmp_path))
    inspection = inspect_model(load_config("joint"))
    assert inspection.why_not == "builtin:generalist is not pre-trained yet (temper pretrain makes it)"
