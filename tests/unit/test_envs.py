"""The environment protocol's plumbing: finding and checking environments, an episode's
rewards and counters in the Rewarder, chat templates the runner can or cannot append to,
and the checks a config gets before any episode is played."""

from __future__ import annotations

import pytest

from tempering.build import build_tasks
from tempering.config import ConfigError, TrainConfig
from tempering.envs import Step, check_env, make_env
from tempering.envs.runner import ChatTurns
from tempering.models.tiny import build_tokenizer
from tempering.rewards import Rewarder
from tempering.types import Group, Problem, Rollout, Turn, episode_totals, transcript


class Echo:
    stop = ()

    def __init__(self, times: int = 1):
        self.times = times

    def reset(self, problem):
        return problem.prompt

    def step(self, completion):
        return Step(done=True)


class EchoWithTokenizer(Echo):
    def __init__(self, tokenizer, times: int = 1):
        super().__init__(times)
        self.tokenizer = tokenizer


def test_make_env_imports_module_class_and_passes_a_tokenizer_only_to_classes_that_take_one():
    plain = make_env(f"{__name__}:Echo", {"times": 2}, tokenizer="tok")
    assert isinstance(plain, Echo) and plain.times == 2
    assert make_env(f"{__name__}:EchoWithTokenizer", {}, tokenizer="tok").tokenizer == "tok"


def test_check_env_refuses_unknown_names_and_options():
    check_env(f"{__name__}:Echo", {"times": 3})
    check_env(f"{__name__}:EchoWithTokenizer", {})
    with pytest.raises(ValueError, match="unknown environment 'nope'; known: reflection, repo, tools"):
        check_env("nope", {})
    with pytest.raises(ValueError, match="environment .*Echo.*unexpected keyword argument 'colour'"):
        check_env(f"{__name__}:Echo", {"colour": "red"})
    with pytest.raises(ValueError, match="is a class without a step method"):
        check_env("tempering.types:Problem", {})


def test_a_config_with_a_bad_environment_fails_naming_its_task():
    config = TrainConfig.model_validate({"tasks": [{"name": "add", "env": {"name": "nope"}}]})
    with pytest.raises(ConfigError, match=r"tasks\.0 \(add\): unknown environment 'nope'"):
        build_tasks(config)


def _episode(problem, text, turn_rewards, turn_info):
    turns = [Turn(text, 0, 1, "stop", rewards=r, info=i) for r, i in zip(turn_rewards, turn_info)]
    return Rollout(problem, [1], [2], [0.0], text, "stop", 0, turns=turns)


def test_episode_totals_sum_over_turns():
    turns = [Turn("", 0, 1, "stop", rewards={"penalty": -0.1}, info={"tool_calls": 1}),
             Turn("", 1, 2, "stop", rewards={"penalty": -0.1, "bonus": 1.0}, info={"tool_calls": 1, "tool_errors": 1})]
    assert episode_totals(turns) == ({"penalty": pytest.approx(-0.2), "bonus": 1.0},
                                     {"tool_calls": 2.0, "tool_errors": 1.0})


class Task:
    name, domain, metric = "add", "add", "exact_match"
    rewards = {"exact_match": 1.0}


def test_the_rewarder_adds_environment_rewards_and_logs_episode_counters():
    problem = Problem(task="add", id="0", prompt="1+2\n", answer="3", domain="add")
    right = _episode(problem, "answer: 3", [{"penalty": -0.1}, {"penalty": -0.1}],
                     [{"tool_calls": 1}, {"tool_calls": 0}])
    wrong = _episode(problem, "answer: 4", [{}], [{"tool_errors": 1}])
    single = Rollout(problem, [1], [2], [0.0], "answer: 3", "stop", 0)
    rewarder = Rewarder([Task()])
    try:
        record = rewarder.score([Group(problem, [right, wrong, single])])
    finally:
        rewarder.close()
    assert right.reward == pytest.approx(0.8) and right.reward_components["env/penalty"] == pytest.approx(-0.2)
    assert wrong.reward == 0.0 and single.reward == 1.0
    assert record["env/turns"] == pytest.approx(3 / 3)  # two turns and one, over three rollouts
    assert record["env/tool_calls"] == pytest.approx(1 / 3) and record["env/tool_errors"] == pytest.approx(1 / 3)
    assert record["reward/env/penalty"] == pytest.approx(-0.2 / 3)


def test_chat_turns_learn_how_a_template_closes_a_turn():
    tokenizer = build_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<eos>\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant: {% endif %}")
    turns = ChatTurns(tokenizer)
    assert tokenizer.decode(turns.close) == "<eos>\n"
    ended = tokenizer("hi", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    cut = tokenizer("hi", add_special_tokens=False)["input_ids"]
    message = [{"role": "user", "content": "again"}]
    assert tokenizer.decode(turns.observation_ids(message, ended)) == "\nuser: again<eos>\nassistant: "
    assert tokenizer.decode(turns.observation_ids(message, cut)) == "<eos>\nuser: again<eos>\nassistant: "


def test_chat_turns_refuse_a_template_that_rewrites_earlier_turns():
    tokenizer = build_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}{% if loop.last %}LAST {% endif %}{{ m['content'] }}\n"
                               "{% endfor %}")
    with pytest.raises(ConfigError, match="renders a conversation differently"):
        ChatTurns(tokenizer)


def test_transcript_interleaves_model_turns_and_observations():
    problem = Problem(task="add", id="0", prompt="", answer="")
    episode = Rollout(problem, [1], [2], [0.0], "answer: 3", "stop", 0, turns=[
        Turn("<calc>1+2</calc>", 0, 1, "stop", observation="<result>3</result>"),
        Turn("\nwrong", 1, 2, "stop", observation=[{"role": "user", "content": "try again"}]),
        Turn("answer: 3", 2, 3, "stop")])
    assert transcript(episode) == "<calc>1+2</calc><result>3</result>\nwrong\n[user] try again\nanswer: 3"
    assert transcript(Rollout(problem, [1], [2], [0.0], "plain", "stop", 0)) == "plain"
