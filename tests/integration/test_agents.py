"""Agents written against the OpenAI client, trained through the recording endpoint.

The agents here are what a user writes: an ``openai.OpenAI`` client pointed at the base URL
they are given, chat completions in a loop. On the real miniature model the episodes they
play hold exactly the tokens sampled (the learner's fp32 log-probs equal the recorded ones),
the tokens the agent inserted are masked, the user's reward function scores them, and a
failing agent scores 0 without stopping anything. With ``rollout.server`` (``temper serve``
here; vLLM in tests/integration/test_vllm_engine.py and test_vllm_server.py) the calls are
sampled on the server.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import time
from dataclasses import replace

import openai
import pytest
import torch
from tqdm import tqdm

from serving import perturbed, serving
from tempering.build import build_generator, build_tasks
from tempering.config import ConfigError, TrainConfig
from tempering.envs.agent import AgentGenerator, AgentSettings
from tempering.envs.recording import Call
from tempering.eval.sampled import SampledSettings, sample_task
from tempering.models.loading import load_model
from tempering.rewards.base import RewardResult
from tempering.rollout.base import SamplingParams
from tempering.rollout.hf import HFGenerator
from tempering.tasks import build_task
from tempering.train import train
from tempering.types import Problem
from test_envs_tokens import CHAT_TEMPLATE, logprob_gap

CHECK = "check your answer"
SCORED: list[tuple[str, str, int, float]] = []
"""(problem key, answer, calls, score) of every episode :func:`score` graded."""
REFUSED: list[int] = []
"""HTTP statuses the slow agent's late call got."""


def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)


def ask_then_check(base_url: str, problem: Problem) -> str:
    """Asks, then feeds back a "check your answer" message and asks again: a linear conversation."""
    chat = client(base_url).chat.completions
    messages = [{"role": "user", "content": problem.prompt.strip()}]
    first = chat.create(model="gpt-4o-mini", messages=messages, max_tokens=12, temperature=0.3)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": CHECK}]
    return chat.create(model="gpt-4o-mini", messages=messages, max_tokens=12).choices[0].message.content


def ask_twice_afresh(base_url: str, problem: Problem) -> str:
    """Asks, then asks about its first answer in a new conversation: history rewritten."""
    chat = client(base_url).chat.completions
    first = chat.create(model="m", messages=[{"role": "user", "content": problem.prompt.strip()}], max_tokens=8)
    again = [{"role": "user", "content": f"{CHECK}: {first.choices[0].message.content}"}]
    return chat.create(model="m", messages=again, max_tokens=8).choices[0].message.content


def ask_streaming(base_url: str, problem: Problem) -> str:
    """One question, its answer read from the stream of chunks."""
    chunks = client(base_url).chat.completions.create(
        model="m", messages=[{"role": "user", "content": problem.prompt.strip()}], max_tokens=10, stream=True)
    return "".join(chunk.choices[0].delta.content or "" for chunk in chunks)


def score(problem: Problem, answer, calls) -> float:
    value = 0.25 * len(calls) + float(problem.answer in (answer or ""))
    SCORED.append((problem.key, answer, len(calls), value))
    return value


def boom_after_a_call(base_url: str, problem: Problem) -> str:
    client(base_url).chat.completions.create(model="m", messages=[{"role": "user", "content": problem.prompt}],
                                             max_tokens=6)
    raise RuntimeError("the agent's parser failed")


def boom_at_once(base_url: str, problem: Problem) -> str:
    raise KeyError("no such tool")


def too_slow(base_url: str, problem: Problem) -> str:
    time.sleep(1.5)
    try:
        client(base_url).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4)
    except openai.APIStatusError as exc:
        REFUSED.append(exc.status_code)
    return "85"


def raising_reward(problem: Problem, answer, calls) -> float:
    raise ZeroDivisionError("the user's grader")


def problems(task: str, prompts: list[str]) -> list[Problem]:
    return [Problem(task=task, id=str(i), prompt=p, answer=p.split("=")[-1].strip()) for i, p in enumerate(prompts)]


def settings(agent, reward=score, timeout_s=60.0, max_calls=4) -> AgentSettings:
    return AgentSettings(agent, reward, timeout_s, concurrency=8, max_calls=max_calls)


def with_chat_template(policy):
    """``(model, tokenizer)`` with a copy of the tokenizer that carries a chat template (the
    character tokenizer renders it one way only)."""
    model, tokenizer = policy
    chat = copy.deepcopy(tokenizer)
    chat.chat_template = CHAT_TEMPLATE
    return model, chat


@pytest.fixture(scope="module")
def chat_policy(tiny_policy):
    """The miniature model with a chat template."""
    return with_chat_template(tiny_policy)


def play(model, tokenizer, agents: dict, prompts: list[str], group_size=3, seed=0, **sampler):
    generator = AgentGenerator(None, HFGenerator(model, tokenizer, **sampler), agents)
    chosen = [p for task in agents for p in problems(task, prompts)]
    groups = generator.generate(chosen, group_size, SamplingParams(max_new_tokens=10),
                                policy_version=7, generator=torch.Generator().manual_seed(seed))
    return groups


def test_a_linear_conversation_is_one_rollout_of_the_exact_tokens(chat_policy):
    model, chat = chat_policy
    SCORED.clear()
    groups = play(model, chat, {"add": settings(ask_then_check)}, ["47+38=85", "12+30=42"], chat_template=True)
    rollouts = [r for g in groups for r in g.rollouts]
    assert [len(g.rollouts) for g in groups] == [3, 3]
    assert logprob_gap(model, rollouts, chat.pad_token_id) < 1e-4
    for rollout in rollouts:
        first, second = rollout.turns
        assert rollout.policy_version == 7
        assert rollout.loss_mask == [1] * first.end + [0] * len(first.observation_ids) + [1] * (second.end - second.start)
        assert second.start == first.end + len(first.observation_ids)
        conversation = [{"role": "user", "content": rollout.problem.prompt.strip()},
                        {"role": "assistant", "content": first.text}, {"role": "user", "content": CHECK}]
        rendered = chat.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        assert chat.decode(rollout.prompt_ids + rollout.completion_ids[:second.start]) == rendered
        assert rollout.text == second.text
        assert second.rewards == {"agent": 0.5 + (rollout.problem.answer in second.text)}
        assert second.info == {"agent_calls": 2.0, "agent_errors": 0.0}
    assert sorted(s[3] for s in SCORED) == sorted(r.turns[-1].rewards["agent"] for r in rollouts)
    again = play(model, chat, {"add": settings(ask_then_check)}, ["47+38=85", "12+30=42"], chat_template=True)
    assert [r.completion_ids for g in again for r in g.rollouts] == [r.completion_ids for r in rollouts]


def test_an_agent_that_rewrites_its_history_gives_a_rollout_per_call(chat_policy):
    model, chat = chat_policy
    groups = play(model, chat, {"add": settings(ask_twice_afresh)}, ["47+38=85"], group_size=2, chat_template=True)
    (group,) = groups
    assert len(group.rollouts) == 4, "two episodes of two calls"
    assert logprob_gap(model, group.rollouts, chat.pad_token_id) < 1e-4
    for first, second in (group.rollouts[:2], group.rollouts[2:]):
        assert CHECK in chat.decode(second.prompt_ids) and CHECK not in chat.decode(first.prompt_ids)
        for rollout in (first, second):
            assert rollout.loss_mask == [1] * len(rollout.completion_ids)
            assert rollout.text == second.turns[0].text, "each call is graded on the episode's answer"
            assert rollout.turns[0].rewards == first.turns[0].rewards
        assert first.turns[0].info["agent_calls"] == 2 and not second.turns[0].info


def test_a_streaming_agent_gets_the_recorded_completion(chat_policy):
    model, chat = chat_policy
    SCORED.clear()
    (group,) = play(model, chat, {"add": settings(ask_streaming)}, ["47+38=85"], group_size=2, chat_template=True)
    assert logprob_gap(model, group.rollouts, chat.pad_token_id) < 1e-4
    assert all(r.turns[0].info == {"agent_calls": 1.0, "agent_errors": 0.0} for r in group.rollouts)
    assert sorted(answer for _, answer, _, _ in SCORED) == sorted(r.text for r in group.rollouts)
    assert all(r.text for r in group.rollouts)


def test_failing_agents_score_0_are_counted_and_do_not_stop_the_others(tiny_policy):
    model, tokenizer = tiny_policy
    REFUSED.clear()
    agents = {"boom": settings(boom_after_a_call), "early": settings(boom_at_once),
              "slow": settings(too_slow, timeout_s=0.5), "grader": settings(ask_twice_afresh, raising_reward),
              "fine": settings(ask_twice_afresh)}
    groups = play(model, tokenizer, agents, ["47+38=85"], group_size=2)
    by_task = {g.problem.task: g.rollouts for g in groups}
    for task, rollouts in by_task.items():
        errors = sum(r.turns[-1].info.get("agent_errors", 0.0) for r in rollouts)
        assert errors == (0 if task == "fine" else 2), task
        if task != "fine":
            assert all(r.turns[-1].rewards["agent"] == 0.0 and r.text == "" for r in rollouts), task
    assert all(sum(r.loss_mask) > 0 for r in by_task["boom"]), "the calls made before the failure are kept"
    assert [r.completion_ids for r in by_task["early"]] == [[], []]
    assert by_task["early"][0].prompt_ids == tokenizer("47+38=85")["input_ids"]
    assert [r.completion_ids for r in by_task["slow"]] == [[], []]
    deadline = time.monotonic() + 60  # the abandoned agents wake up and call after the episode is over
    while len(REFUSED) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert REFUSED == [410, 410], "a timed-out episode's late calls are refused"


def write_chat_model(source, folder):
    """A copy of the miniature model whose tokenizer carries a chat template."""
    shutil.copytree(source, folder)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "chat_template": CHAT_TEMPLATE}))
    return folder


def agent_config(model_dir, run_dir, **changes) -> dict:
    env = {"name": "agent", "max_turns": 2,
           "options": {"agent": f"{__name__}:ask_then_check", "reward": f"{__name__}:score", "timeout_s": 60}}
    return {"steps": 3, "threads": 1, "run_dir": str(run_dir), "model": {"path": str(model_dir)},
            "tasks": [{"name": "add", "options": {"digits": [2]}, "rewards": {}, "env": env}],
            "rollout": {"prompts_per_step": 2, "group_size": 3, "max_new_tokens": 12},
            "learner": {"lr": 1e-3, "warmup_steps": 0}, "algorithm": {"entropy_coef": 0.01},
            "eval": {"problems_per_task": 3, "max_new_tokens": 12}, "checkpoint": {"every": 0}, **changes}


def test_training_an_openai_agent_through_the_recording_endpoint(tiny_model_dir, tmp_path):
    model_dir = write_chat_model(tiny_model_dir, tmp_path / "model")
    SCORED.clear()
    summary = train(TrainConfig.model_validate(agent_config(model_dir, tmp_path / "run")), progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3
    assert len(SCORED) == 3 + 3 * 2 * 3 + 3, "the user's function scored every episode (held-out ones too)"
    for step, record in enumerate(records):
        scores = [s[3] for s in SCORED[3 + step * 6:3 + (step + 1) * 6]]
        assert record["reward"] == pytest.approx(sum(scores) / 6), "the reward is the user's score alone"
        assert record["reward/env/agent"] == pytest.approx(record["reward"])
        assert record["env/agent_calls"] == 2.0 and record["env/agent_errors"] == 0.0
        assert record["mismatch/abs_logp"] < 1e-4
    assert max(r["grad_norm"] for r in records) > 0
    example = summary["eval_after"]["examples"]["add"]["completion"]
    assert CHECK in example, "held-out episodes are played by the agent too"


@pytest.mark.parametrize("change, message", [
    ({"agent": "nomodule"}, "env.options.agent='nomodule': name a function as module:function"),
    ({"reward": f"{__name__}:client"}, "env.options.reward="),
    ({"timeout_s": 0}, "env.options.timeout_s=0"),
    ({"tools": []}, "env.options.tools: the agent environment takes agent, reward, timeout_s, concurrency"),
])
def test_bad_agent_options_are_config_errors_naming_the_option(tmp_path, change, message):
    config = agent_config("unused", tmp_path / "run")
    config["tasks"][0]["env"]["options"].update(change)
    with pytest.raises(ConfigError, match=re.escape(f"tasks.0 (add): {message}")):
        build_tasks(TrainConfig.model_validate(config))


CALLS: list[list[Call]] = []
"""The calls of every episode :func:`keep_calls` graded, in episode order."""


def keep_calls(problem: Problem, answer, calls) -> float:
    CALLS.append(list(calls))
    return float(problem.answer in (answer or ""))


def served_agent_config(model_dir, run_dir, rollout: dict) -> TrainConfig:
    """:func:`agent_config`'s agent (:func:`ask_then_check`), graded by :func:`keep_calls`,
    sampled as ``rollout`` says; its tasks are built as a run builds them, which refuses no sampler."""
    config = agent_config(model_dir, run_dir, rollout=rollout)
    config["tasks"][0]["env"]["options"]["reward"] = f"{__name__}:keep_calls"
    validated = TrainConfig.model_validate(config)
    build_tasks(validated)
    return validated


def episodes_after_new_weights(generator, model, tokenizer) -> tuple[list, torch.nn.Module]:
    """``(rollouts, new weights)``: ``generator``, a run's whose sampler holds its own copy of the
    weights (vLLM, a server), takes new weights and plays :func:`ask_then_check` episodes. Each
    rollout is checked to hold its episode's recorded calls token for token: the first call's
    prompt, then every token after it, the sampled ones with their recorded log-probs and trained,
    the ones the agent inserted masked with log-prob 0. The caller compares the log-probs with
    the new weights' (and the old ones', the control)."""
    moved = perturbed(model, 1)
    generator.load_weights({k: v.detach().clone() for k, v in moved.state_dict().items()})
    CALLS.clear()
    groups = generator.generate(problems("add", ["47+38=85", "12+30=42"]), 3, SamplingParams(max_new_tokens=10),
                                policy_version=1, generator=torch.Generator().manual_seed(0))
    rollouts = [r for g in groups for r in g.rollouts]
    assert len(rollouts) == len(CALLS) == 6, "an episode a rollout: every conversation was linear"
    for rollout, (first, second) in zip(rollouts, CALLS):
        inserted = second.prompt_ids[len(first.prompt_ids) + len(first.completion_ids):]
        assert second.prompt_ids == first.prompt_ids + first.completion_ids + inserted
        assert CHECK in tokenizer.decode(inserted)
        assert rollout.prompt_ids == first.prompt_ids
        assert rollout.completion_ids == first.completion_ids + inserted + second.completion_ids
        assert rollout.logprobs == first.logprobs + [0.0] * len(inserted) + second.logprobs
        sampled = [1] * len(first.completion_ids), [1] * len(second.completion_ids)
        assert rollout.loss_mask == sampled[0] + [0] * len(inserted) + sampled[1]
        assert rollout.text == second.text and rollout.policy_version == 1
    return rollouts, moved


def check_stop_token_ids(sampler, tokenizer) -> None:
    """``sampler`` ends a completion at a token of ``stop_token_ids`` (what an agent's request may
    add to the run's settings): the draws of the same seed without them, cut after that token."""
    prompt, params = tokenizer("47+38=")["input_ids"], SamplingParams(max_new_tokens=10)
    for seed in range(20):
        ((free, _, _),) = sampler.sample([prompt], params, torch.Generator().manual_seed(seed))
        if len(free) >= 4:
            break
    stop = free[2]
    ((cut, _, reason),) = sampler.sample([prompt], replace(params, stop_token_ids=(stop,)),
                                         torch.Generator().manual_seed(seed))
    assert (cut, reason) == (free[: free.index(stop) + 1], "stop") and len(cut) < len(free)


ASKED: list[tuple[int, str]] = []
"""``(status, message)`` of each request :func:`ask_for_more_than_a_server_gives` made."""


def ask_for_more_than_a_server_gives(base_url: str, problem: Problem) -> str:
    """Asks for alternatives, then for the prompt's log-probs, then for the sampled tokens' log-probs alone."""
    api = client(base_url)
    messages = [{"role": "user", "content": problem.prompt.strip()}]
    for ask in (lambda: api.chat.completions.create(model="m", messages=messages, max_tokens=4, logprobs=True,
                                                    top_logprobs=2),
                lambda: api.completions.create(model="m", prompt=problem.prompt, max_tokens=4, echo=True, logprobs=0)):
        try:
            ask()
            ASKED.append((200, ""))
        except openai.BadRequestError as exc:
            ASKED.append((exc.status_code, exc.body["message"]))
    reply = api.chat.completions.create(model="m", messages=messages, max_tokens=4, logprobs=True)
    ASKED.append((200, json.dumps([entry.logprob for entry in reply.choices[0].logprobs.content])))
    return reply.choices[0].message.content


def test_an_agent_samples_on_temper_serve_through_rollout_server(tiny_model_dir, tempering_cache, tmp_path):
    """A run with ``rollout.server`` samples its agents' calls on the server: after the server
    took new weights, the rollouts are the recorded calls and their log-probs are the new
    weights'. What only the built-in sampler computes (alternatives, a prompt's log-probs) is
    refused, not answered wrongly."""
    model_dir = write_chat_model(tiny_model_dir, tmp_path / "model")
    model, tokenizer = load_model(str(model_dir))
    with serving(model_dir, tempering_cache) as url:
        config = served_agent_config(model_dir, tmp_path / "run", {"server": {"url": url}})
        generator = build_generator(config, model, tokenizer, batch_size=8)
        rollouts, moved = episodes_after_new_weights(generator, model, tokenizer)
        assert logprob_gap(moved, rollouts, tokenizer.pad_token_id) < 1e-4
        assert logprob_gap(model, rollouts, tokenizer.pad_token_id) > 1e-2, "the control: not the old weights'"
        check_stop_token_ids(generator.sampler, tokenizer)
        ASKED.clear()
        asking = AgentGenerator(generator, generator.sampler, {"add": settings(ask_for_more_than_a_server_gives)})
        (group,) = asking.generate(problems("add", ["47+38=85"]), 1, SamplingParams(max_new_tokens=4))
    (alternatives, alternatives_message), (echo, echo_message), (fine, sampled) = ASKED
    assert (alternatives, echo, fine) == (400, 400, 200)
    assert "'top_logprobs' above 0" in alternatives_message and "'echo' with 'logprobs'" in echo_message
    (rollout,) = group.rollouts
    assert rollout.turns[0].info == {"agent_calls": 1.0, "agent_errors": 0.0}, "refused requests are no calls"
    assert json.loads(sampled) == pytest.approx(rollout.logprobs, abs=1e-6)


class FirstProblem:
    """A grader that says which problem a sample came from: 1 for the first, 0 for the others."""

    def __init__(self, first: Problem):
        self.first = first

    def score_batch(self, problems, rollouts):
        return [RewardResult(float(p == self.first and r.problem == p)) for p, r in zip(problems, rollouts)]


def test_sampled_evaluation_gives_each_problem_all_its_episodes_rollouts(chat_policy):
    """An episode whose agent rewrote its history gives a rollout per call, so a problem's group
    holds more rollouts than it has samples; each must still be that problem's."""
    model, chat = chat_policy
    task = build_task("add", seed=0)
    chosen = task.eval_problems(2)
    generator = AgentGenerator(None, HFGenerator(model, chat, chat_template=True),
                               {"add": settings(ask_twice_afresh, reward=None)})
    settings_ = SampledSettings(2, (1, 2), SamplingParams(max_new_tokens=8), seed=0)
    found = sample_task(generator, task, FirstProblem(chosen[0]), {}, 2, settings_, {}, tqdm(disable=True),
                        torch.Generator().manual_seed(0))
    assert [p.scores for p in found.problems] == [[1.0] * 4, [0.0] * 4], "two episodes of two calls each"
