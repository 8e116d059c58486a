"""The public API: its names are pinned (changing them is a deliberate edit here), each
resolves, ``import tempering`` stays cheap, and the registering decorators reach the
registries a config's names are looked up in."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import tempering

PUBLIC = [
    "__version__",
    "train", "evaluate", "load_model", "run_code", "load_config",
    "TrainConfig", "ConfigError",
    "Problem", "Rollout", "RewardResult", "Task", "Environment", "Step", "AdvantageInputs", "LossInputs",
    "register_reward", "register_task", "register_advantage", "register_loss", "register_env",
    "Executor", "RunRequest", "RunResult", "Limits", "TestSpec", "SandboxUnavailable",
]


def test_the_public_names_are_exactly_these():
    assert tempering.__all__ == PUBLIC


def test_every_public_name_resolves_to_what_its_module_defines():
    for name in PUBLIC[1:]:
        module = sys.modules.get(tempering.EXPORTS[name]) or __import__(tempering.EXPORTS[name], fromlist=["_"])
        assert getattr(tempering, name) is getattr(module, name), name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        tempering.nothing


def test_submodules_named_like_api_functions_do_not_replace_them():
    from tempering.eval.greedy import evaluate as greedy
    from tempering.train import train as loop

    assert tempering.train is tempering.api.train and tempering.evaluate is tempering.api.evaluate
    assert sys.modules["tempering.train"].train is loop and sys.modules["tempering.eval.greedy"].evaluate is greedy


def test_the_type_checking_imports_name_the_same_modules_as_the_table():
    tree = ast.parse(Path(tempering.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING")
    imported = {alias.name: node.module for node in block.body for alias in node.names}
    assert imported == tempering.EXPORTS


def test_import_tempering_loads_no_heavy_package():
    code = ("import sys, tempering; print(sorted(m for m in ('torch', 'transformers', 'pydantic', 'numpy', 'yaml') "
            "if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", f"import tempering loaded {loaded}"


def test_load_config_takes_a_dict_an_object_or_a_shipped_name_with_overrides():
    config = tempering.load_config({"steps": 5, "tasks": [{"name": "add"}]}, ["rollout.group_size=4"])
    assert config.steps == 5 and config.rollout.group_size == 4 and [t.name for t in config.tasks] == ["add"]
    assert tempering.load_config(config, ["steps=7"]).steps == 7 and config.steps == 5, "the object is not changed"
    assert tempering.load_config("quickstart").tasks == tempering.TrainConfig().tasks
    with pytest.raises(tempering.ConfigError, match=r"rollout.group_size=1: Input should be greater than or equal to 2"):
        tempering.load_config({"rollout": {"group_size": 1}})
    with pytest.raises(tempering.ConfigError, match=r"nosuch: unknown key"):
        tempering.load_config({}, ["nosuch=1"])


def test_the_functions_refuse_what_the_commands_refuse_with_a_config_error_before_any_model_work(tmp_path):
    """resume=True without a run folder started afresh (the CLI refuses it); a bad dtype was a
    KeyError and a bad task entry a pydantic ValidationError."""
    for run_dir in (None, tmp_path / "nosuch"):
        with pytest.raises(tempering.ConfigError, match=rf"resume=True: run_dir={run_dir} is not a run folder"):
            tempering.train({"steps": 1}, run_dir=run_dir, resume=True)
    assert not any(tmp_path.iterdir()), "no run folder was made"
    with pytest.raises(tempering.ConfigError, match=r"model.dtype='bogus': Input should be 'float32' or 'bfloat16'"):
        tempering.load_model(str(tmp_path / "model"), dtype="bogus")
    with pytest.raises(tempering.ConfigError, match=r"tasks.0.nosuch: unknown key \(allowed here: env, name,"):
        tempering.evaluate(str(tmp_path / "model"), tasks=[{"name": "add", "nosuch": 1}])
    with pytest.raises(tempering.ConfigError, match=r"tasks.1.weight='heavy': Input should be a valid number"):
        tempering.evaluate(str(tmp_path / "model"), tasks=["sub", {"name": "add", "weight": "heavy"}])


@pytest.fixture
def registered():
    """Names registered by a test, taken out of their registries afterwards."""
    from tempering.algorithms import ADVANTAGES, LOSSES
    from tempering.envs import ENVS
    from tempering.rewards import REWARDS
    from tempering.tasks import TASKS

    tables = {"reward": REWARDS, "task": TASKS, "advantage": ADVANTAGES, "loss": LOSSES, "env": ENVS}
    names: list[tuple[str, str]] = []
    yield lambda kind, name: names.append((kind, name)) or name
    for kind, name in names:
        tables[kind].pop(name, None)


def test_the_decorators_register_where_config_names_are_looked_up(registered):
    from tempering.algorithms.advantages import ADVANTAGES
    from tempering.algorithms.losses import LOSSES
    from tempering.envs import env_class
    from tempering.rewards import resolve_reward
    from tempering.tasks import build_task

    @tempering.register_reward(registered("reward", "api_test_reward"))
    def reward(problem, completion):
        return 1.0

    @tempering.register_task(registered("task", "api_test_task"))
    def task(name, seed, size=3):
        return (name, seed, size)

    @tempering.register_advantage(registered("advantage", "api_test_advantage"))
    def advantage(inputs):
        return inputs.rewards_B

    @tempering.register_loss(registered("loss", "api_test_loss"))
    def loss(inputs):
        return -inputs.advantages_BT, {}

    @tempering.register_env(registered("env", "api_test_env"))
    class Env:
        def reset(self, problem):
            return problem.prompt

        def step(self, completion):
            return tempering.Step(done=True)

    assert resolve_reward("api_test_reward") is reward
    assert build_task("api_test_task", seed=4, size=9) == ("api_test_task", 4, 9)
    assert ADVANTAGES["api_test_advantage"] is advantage and LOSSES["api_test_loss"] is loss
    assert env_class("api_test_env") is Env
