"""Config loading: dotted overrides, and errors that name the key, the bad value and what is allowed."""

import pytest

from tempering.config import ConfigError, TrainConfig, apply_override, load_config, save_resolved
from tempering.build import build_tasks, resolve_algorithm


def _error(overrides, path=None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path, overrides)
    return str(caught.value)


def test_overrides_are_parsed_as_yaml_into_typed_fields():
    config = load_config(None, [
        "rollout.group_size=8", "tasks.0.options.digits=[2,3]", "learner.lr=5e-5", "run_dir=null",
        "model.chat_template=true", 'rollout.stop=["\\n\\n", END]', "learner.betas=[0.8,0.9]",
    ])
    assert config.rollout.group_size == 8 and isinstance(config.rollout.group_size, int)
    assert config.tasks[0].options["digits"] == [2, 3]
    assert config.learner.lr == 5e-5
    assert config.run_dir is None
    assert config.model.chat_template is True
    assert config.rollout.stop == ["\n\n", "END"]
    assert config.learner.betas == (0.8, 0.9)


def test_an_override_can_fill_a_section_the_file_leaves_out(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text("steps: 3\n")
    config = load_config(path, ["learner.bf16=true"])
    assert config.steps == 3
    assert config.learner.bf16 is True
    assert config.learner.lr == TrainConfig().learner.lr, "the rest of the section keeps its defaults"


def test_the_built_in_config_is_found_by_name():
    assert load_config("quickstart") == load_config(None)


def test_the_resolved_config_round_trips(tmp_path):
    config = load_config(None, ["rollout.group_size=4", "tasks.1.options.digits=[3]"])
    save_resolved(config, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == config


@pytest.mark.parametrize("overrides, expected", [
    (["nosuch.key=1"], ["nosuch: unknown key", "allowed here:", "rollout", "steps"]),
    (["rollout.nosuch=1"], ["rollout.nosuch: unknown key", "allowed here:", "group_size", "temperature"]),
    (["tasks.0.nosuch=1"], ["tasks.0.nosuch: unknown key", "allowed here: env, name, options, rewards, weight"]),
    (["rollout.group_size=abc"], ["rollout.group_size='abc'", "valid integer", "completions sampled per problem"]),
    (["rollout.group_size=1"], ["rollout.group_size=1", "greater than or equal to 2"]),
    (["steps=1.5"], ["steps=1.5", "valid integer"]),
    (["rollout.temperature=abc"], ["rollout.temperature='abc'", "valid number"]),
    (["learner.lr=-1"], ["learner.lr=-1", "greater than or equal to 0", "peak learning rate"]),
    (["rollout.top_p=1.5"], ["rollout.top_p=1.5", "less than or equal to 1"]),
    (["algorithm.kl_estimator=k4"], ["algorithm.kl_estimator='k4'", "'k1', 'k2', 'k3', 'abs', 'k1+' or 'k3+'"]),
    (["learner.schedule=step"], ["learner.schedule='step'", "'constant', 'linear' or 'cosine'"]),
    # a boolean is not a number, though pydantic's lax mode reads true as 1
    (["steps=true"], ["steps=True: Input should be a number, not true or false", "RL steps"]),
    (["learner.lr=true"], ["learner.lr=True: Input should be a number, not true or false"]),
    (["rollout.group_size=false"], ["rollout.group_size=False: Input should be a number"]),
    (["eval.max_new_tokens=true"], ["eval.max_new_tokens=True: Input should be a number"]),
])
def test_bad_keys_and_values_are_named_with_what_is_allowed(overrides, expected):
    message = _error(overrides)
    for fragment in expected:
        assert fragment in message


def test_every_bad_value_is_reported_at_once():
    message = _error(["steps=abc", "rollout.group_size=abc"])
    assert "steps='abc'" in message and "rollout.group_size='abc'" in message


@pytest.mark.parametrize("assignment, expected", [
    ("steps", "override 'steps' must look like key.path=value"),
    ("=3", "must look like key.path=value"),
    ("steps.x=1", "steps is a value, not a section; cannot set steps.x"),
    ("tasks.7.name=add", "tasks.7: '7' is not an index of this list (0..0)"),
    ("tasks.first.name=add", "tasks.first: 'first' is not an index of this list"),
    ("tasks.0.name.x=1", "tasks.0.name is a value, not a section"),
    ("rollout.stop.0.x=1", "rollout.stop.0 is a value, not a section"),
])
def test_malformed_overrides_are_config_errors(assignment, expected):
    data = {"steps": 3, "tasks": [{"name": "add"}], "rollout": {"stop": ["END"]}}
    with pytest.raises(ConfigError) as caught:
        apply_override(data, assignment)
    assert expected in str(caught.value)


@pytest.mark.parametrize("text, expected", [
    ("steps: [1, 2\n", "is not valid YAML"),
    ("- a\n- b\n", "must hold a mapping of keys, not list"),
])
def test_a_bad_config_file_names_the_file_and_the_problem(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    message = _error([], path)
    assert str(path) in message and expected in message


def test_a_missing_or_unreadable_config_file_is_a_config_error(tmp_path):
    assert f"config file {tmp_path / 'nosuch.yaml'} does not exist" in _error([], tmp_path / "nosuch.yaml")
    assert f"config file {tmp_path} cannot be read" in _error([], tmp_path)
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    assert f"config file {binary} cannot be read" in _error([], binary)


def test_an_empty_config_file_means_all_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(path) == TrainConfig()


@pytest.mark.parametrize("overrides, expected", [
    (["tasks.0.name=nosuch"], "tasks.0 (nosuch): unknown task 'nosuch'; known: add, code, code:<type>, dataset, humaneval, long_context, long_context:<type>, mul, repo, rg:<type>, sub"),
    (["tasks.1.options.digits=[9]"], "tasks.1 (sub): digits must be a non-empty list of sizes 1..6"),
    (["tasks.0.options.nosuch=1"], "tasks.0 (add):"),
    (["tasks.2.rewards={nosuch: 1}"], "tasks.2 (mul): unknown reward 'nosuch'; known: cited_match, code, code_format, consistency, exact_match, exact_steps, format,"),
    (["tasks.1.name=add"], "tasks: each task may appear once"),
    # the code task's options are typed by its class (its factory takes any): none taken for what it is not
    (["tasks.0.name=code", "tasks.0.options.partial=maybe"], "tasks.0 (code): options.partial='maybe': expected bool"),
    (["tasks.0.name=code", "tasks.0.options.tests=abc"], "tasks.0 (code): options.tests='abc': expected int"),
    (["tasks.0.name=code", "tasks.0.options.levels=[]"], "tasks.0 (code): levels must be a non-empty list of 1, 2 or 3, got []"),
    (["tasks.0.name=rg:leg_counting", "tasks.0.options.eval_size=abc"], "tasks.0 (rg:leg_counting): options.eval_size='abc': expected int"),
])
def test_bad_task_entries_are_config_errors_naming_the_entry(overrides, expected):
    config = load_config(None, ["tasks=[{name: add}, {name: sub}, {name: mul}]", *overrides])
    with pytest.raises(ConfigError) as caught:
        build_tasks(config)
    assert expected in str(caught.value)


@pytest.mark.parametrize("key", ["advantage", "loss", "aggregation"])
def test_unknown_algorithm_names_are_config_errors_listing_the_known_ones(key):
    config = load_config(None, [f"algorithm.{key}=nosuch"])
    with pytest.raises(ConfigError) as caught:
        resolve_algorithm(config)
    assert f"algorithm.{key}: unknown {key} 'nosuch'; known:" in str(caught.value)


def test_algorithms_resolve_from_module_function_names():
    config = load_config(None, ["algorithm.loss=tempering.algorithms.losses:ppo_clip"])
    from tempering.algorithms.losses import ppo_clip

    assert resolve_algorithm(config)["loss"] is ppo_clip
