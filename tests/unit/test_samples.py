"""Rollout samples (tempering.reporting.samples): which rollouts a step keeps and what a line holds."""

import json

from tempering.reporting.samples import SampleWriter, chosen
from tempering.types import Group, Problem, Rollout, Turn


def _rollout(problem, text, reward, turns=()):
    rollout = Rollout(problem, [1], [2, 3, 4], [0.0] * 3, text, "stop", policy_version=5, turns=list(turns))
    rollout.reward, rollout.reward_components = reward, {"exact_match": reward, "format": 1.0}
    return rollout


def test_the_choice_is_a_share_of_the_step_fixed_by_seed_and_step():
    assert len(chosen(40, 0.1, seed=3, step=7)) == 4
    assert len(chosen(5, 0.1, seed=3, step=7)) == 1  # rounded up: every step shows something
    assert chosen(40, 0.1, seed=3, step=7) == chosen(40, 0.1, seed=3, step=7)
    draws = {tuple(chosen(40, 0.1, seed=3, step=s)) for s in range(1, 6)}
    assert len(draws) > 1, "each step draws afresh"
    assert chosen(40, 0.1, seed=3, step=7) != chosen(40, 0.1, seed=4, step=7)


def test_a_line_holds_a_single_completion_and_an_episode_with_its_turns(tmp_path):
    plain = Problem(task="add", id="7", prompt="12+30=", answer="42", domain="arith")
    chat = Problem(task="tools", id="1", prompt=[{"role": "user", "content": "6*7?"}], answer="42")
    episode = _rollout(chat, "answer: 42", 1.0, turns=[
        Turn("<calc>6*7</calc>", 0, 1, "stop", observation="<result>42</result>", rewards={"call": 0.1},
             info={"tool_calls": 1.0}),
        Turn("answer: 42", 2, 3, "stop")])
    writer = SampleWriter(tmp_path / "samples.jsonl", share=1.0, seed=0)
    writer.write(3, [Group(plain, [_rollout(plain, "answer: 41", 0.0)]), Group(chat, [episode])])
    writer.close()

    first, second = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert first == {"step": 3, "task": "add", "domain": "arith", "id": "7", "prompt": "12+30=", "answer": "42",
                     "completion": "answer: 41", "reward": 0.0, "reward_parts": {"exact_match": 0.0, "format": 1.0},
                     "finish_reason": "stop", "completion_tokens": 3, "policy_version": 5}
    assert second["domain"] == "tools" and second["prompt"] == [{"role": "user", "content": "6*7?"}]
    assert second["completion"] == "<calc>6*7</calc><result>42</result>answer: 42"
    assert second["turns"] == [
        {"text": "<calc>6*7</calc>", "finish_reason": "stop", "observation": "<result>42</result>",
         "rewards": {"call": 0.1}, "info": {"tool_calls": 1.0}},
        {"text": "answer: 42", "finish_reason": "stop", "observation": None, "rewards": {}, "info": {}}]


def test_a_share_of_zero_writes_no_file(tmp_path):
    problem = Problem(task="add", id="0", prompt="", answer="")
    writer = SampleWriter(tmp_path / "samples.jsonl", share=0.0, seed=0)
    writer.write(1, [Group(problem, [_rollout(problem, "x", 0.0)])])
    writer.close()
    assert not (tmp_path / "samples.jsonl").exists()
