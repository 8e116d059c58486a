"""Reward functions written for TRL and verl, called as those trainers call them."""

import textwrap

import pytest

from tempering.rewards import build_reward, resolve_reward
from tempering.rewards.foreign import TrlReward, VerlReward
from tempering.types import Problem, Rollout

REWARDS = '''
seen = []

def trl_accuracy(prompts, completions, completion_ids, solution, **kwargs):
    seen.append(dict(prompts=prompts, completions=completions, completion_ids=completion_ids,
                     solution=solution, **kwargs))
    return [None if s is None else float(c[0]["content"].strip() == s if isinstance(c, list) else c.strip() == s)
            for c, s in zip(completions, solution)]

async def trl_async(prompts, completions, **kwargs):
    return [len(c) for c in completions]

def trl_short(prompts, completions, **kwargs):
    return [1.0]

def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    seen.append(dict(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                     extra_info=extra_info))
    correct = solution_str.strip() == ground_truth
    return {"score": float(correct) + bonus, "acc": correct, "pred": solution_str}

def no_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"acc": 1}
'''


@pytest.fixture
def module(tmp_path, monkeypatch):
    (tmp_path / "user_rewards_for_test.py").write_text(textwrap.dedent(REWARDS))
    monkeypatch.syspath_prepend(str(tmp_path))
    import user_rewards_for_test

    user_rewards_for_test.seen.clear()
    return user_rewards_for_test


def _rollout(prompt, text, **meta):
    problem = Problem(task="t", id="x", prompt=prompt, answer="5", meta={"record": "data.jsonl:1", **meta})
    return problem, Rollout(problem, [1], [7, 8], [0.0, 0.0], text, "stop", 0)


def test_a_trl_reward_gets_the_columns_as_lists_and_conversational_completions(module):
    pairs = [_rollout([{"role": "user", "content": "2+3?"}], "5", solution="5", level=1),
             _rollout("2+2?", "5", solution="4"),
             _rollout("?", "5")]
    reward = build_reward("trl:user_rewards_for_test:trl_accuracy", {"scale": 2})
    results = reward.score_batch(*zip(*pairs))
    assert [r.score for r in results] == [1.0, 0.0, 0.0]
    assert results[2].diagnostics == {"not_applicable": 1}
    (call,) = module.seen
    assert call["completions"][0] == [{"role": "assistant", "content": "5"}] and call["completions"][1] == "5"
    assert call["prompts"][1] == "2+2?" and call["completion_ids"] == [[7, 8]] * 3
    assert call["solution"] == ["5", "4", None] and call["level"] == [1, None, None] and call["scale"] == 2
    assert "record" not in call, "tempering's own location is not a column"


def test_a_trl_async_reward_is_awaited_and_a_short_answer_is_refused(module):
    pairs = [_rollout("?", "abc"), _rollout("?", "de")]
    assert [r.score for r in build_reward("trl:user_rewards_for_test:trl_async").score_batch(*zip(*pairs))] == [3, 2]
    with pytest.raises(ValueError, match="returned 1 values for 2 completions"):
        build_reward("trl:user_rewards_for_test:trl_short").score_batch(*zip(*pairs))


def test_a_verl_compute_score_gets_the_record_columns_and_its_dict_becomes_components(module):
    problem, rollout = _rollout([{"role": "user", "content": "2+3?"}], " 5", data_source="openai/gsm8k",
                                reward_model={"style": "rule", "ground_truth": "5"}, extra_info={"index": 3})
    (result,) = build_reward("verl:user_rewards_for_test:compute_score", {"bonus": 0.5}).score_batch([problem], [rollout])
    assert result.score == 1.5 and result.components == {"acc": 1.0}
    assert module.seen == [{"data_source": "openai/gsm8k", "solution_str": " 5", "ground_truth": "5",
                            "extra_info": {"index": 3}}]
    with pytest.raises(ValueError, match=r"returned a dict without 'score' \(keys: acc\)"):
        build_reward("verl:user_rewards_for_test:no_score").score_batch([problem], [rollout])


def test_foreign_names_resolve_to_their_adapters_and_bad_targets_are_named(module):
    assert resolve_reward("trl:user_rewards_for_test:trl_accuracy") is TrlReward
    assert resolve_reward("verl:user_rewards_for_test:compute_score") is VerlReward
    with pytest.raises(ValueError, match="cannot import reward 'user_rewards_for_test:nothing'"):
        resolve_reward("trl:user_rewards_for_test:nothing")
