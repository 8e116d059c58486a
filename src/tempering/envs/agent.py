"""Agents through a recording proxy: a user's agent, written against an OpenAI-compatible
endpoint, trained unchanged.

A task names its agent as its environment::

    env: {name: agent, max_turns: 4, options: {agent: "mymod:run", reward: "mymod:score"}}

- ``agent(base_url, problem) -> answer or None`` calls ``base_url`` (an OpenAI client's
  ``base_url``) as often as it likes, e.g. a loop of chat completions with tool results it
  computes itself, and returns its answer (None: it has none).
- ``reward(problem, answer, calls) -> float`` (optional) scores the episode, with ``calls``
  the :class:`~tempering.envs.recording.Call` records of what was sampled; the score joins
  the rollout's reward as ``env/agent``. The task's own rewards grade the answer (the
  rollout's ``text``) as they grade a completion, so to train on the function alone give the
  task ``rewards: {}`` (its metric is still measured on the answer).
- ``timeout_s`` (default 120): seconds an episode may run, from its agent's start;
  ``concurrency`` (default 32): agents running at once. ``env.max_turns`` bounds the calls
  an episode may make (further ones are refused); ``env.max_tokens`` does not apply.

Each episode's agent runs on a thread of its own against
:class:`~tempering.envs.recording.RecordingServer` on 127.0.0.1, which samples with the
current policy (the sampler this generator wraps: the built-in one, ``rollout.engine: vllm``
or ``rollout.server``; concurrent calls share sampler calls) and records every call's exact
prompt ids, sampled ids and log-probs as that sampler drew them. The episode becomes
training data:

- when each call's prompt continues the previous call's prompt and completion token for
  token (a linear conversation), one rollout whose completion is every token after the
  first prompt, the model's sampled tokens trained and the tokens the agent inserted
  (rendered messages, tool results) masked, as :mod:`tempering.envs.runner` makes them;
- otherwise (the agent rewrote its history: dropped or edited turns, or the chat template
  renders earlier turns differently once more follow, or a request asked for ``n > 1``)
  one rollout per call, each with the episode's reward: each call's tokens were drawn in
  its own context, which no single sequence holds, and each shares the episode's outcome.
  Such an episode counts once per call in its group's reward statistics.

An agent that raises or runs out of time (and a ``reward`` that raises) scores 0, with
no answer; the calls it made are kept as data, and it is counted in ``env/agent_errors``.
An episode that made no call at all is an empty completion after the problem's prompt,
which carries its score into the group's statistics and trains no token. Per step the
means over rollouts of the score (``reward/env/agent``), ``env/agent_calls`` and
``env/agent_errors`` are logged.

Not done: what :mod:`tempering.rollout.server` leaves out; with vLLM or a server, requests for
alternatives or prompt log-probs (refused: :mod:`tempering.envs.recording`); a timed-out
agent's thread cannot be stopped, only refused further calls.
"""

from __future__ import annotations

import inspect
import queue
import sys
import threading
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Optional

import torch

from tempering.envs.recording import Call, Recording, RecordingServer
from tempering.envs.runner import WrappingGenerator, split_generate
from tempering.registry import resolve
from tempering.rollout.base import SamplingParams, TokenSampler, draw_seed
from tempering.rollout.server import OpenAIHTTPServer, serve_in_background
from tempering.types import Group, Problem, Rollout, Turn

AGENT_ENV = "agent"
"""The environment name under which a task names an agent."""
OPTIONS = {"agent": None, "reward": None, "timeout_s": 120.0, "concurrency": 32}


@dataclass(frozen=True)
class AgentSettings:
    agent: Callable[[str, Problem], Any]
    reward: Optional[Callable[[Problem, Optional[str], list[Call]], float]]
    timeout_s: float
    concurrency: int
    max_calls: int


def agent_settings(options: dict[str, Any], max_calls: int) -> AgentSettings:
    """The settings ``env.options`` give; a ValueError naming the option that is wrong."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"env.options.{unknown[0]}: the agent environment takes {', '.join(OPTIONS)}")
    values = {**OPTIONS, **options}
    if values["agent"] is None:
        raise ValueError("env.options.agent: name the agent, module:function(base_url, problem)")
    timeout_s, concurrency = values["timeout_s"], values["concurrency"]
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ValueError(f"env.options.timeout_s={timeout_s!r}: seconds an episode may run, above 0")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"env.options.concurrency={concurrency!r}: agents running at once, 1 or more")
    reward = values["reward"]
    return AgentSettings(_function(values["agent"], "agent", "(base_url, problem)"),
                         None if reward is None else _function(reward, "reward", "(problem, answer, calls)"),
                         float(timeout_s), concurrency, max_calls)


def _function(name: Any, key: str, arguments: str) -> Callable:
    if not isinstance(name, str) or ":" not in name:
        raise ValueError(f"env.options.{key}={name!r}: name a function as module:function{arguments}")
    function = resolve({}, name, f"env.options.{key}")
    try:
        inspect.signature(function).bind(*arguments.strip("()").split(", "))
    except TypeError as exc:
        raise ValueError(f"env.options.{key}={name}: it must take {arguments} ({exc})") from None
    return function


@dataclass
class Outcome:
    answer: Any = None
    error: Optional[str] = None
    score: float = 0.0
    """The ``reward`` function's score (0 after an error, or without one)."""


def run_all(work: list[Callable[[], Any]], concurrency: int, timeouts: list[float],
            on_timeout: Callable[[int], None]) -> list[Outcome]:
    """Each callable on a daemon thread of its own, ``concurrency`` at a time, each given its
    timeout from its start. One still running then is abandoned (a thread cannot be stopped:
    ``on_timeout(i)`` is where its caller cuts it off) and its outcome is an error."""
    outcomes = [Outcome() for _ in work]
    finished: queue.Queue[tuple[int, Outcome]] = queue.Queue()
    deadlines: dict[int, float] = {}
    waiting = iter(range(len(work)))

    def run(i: int) -> None:
        try:
            finished.put((i, Outcome(answer=work[i]())))
        except Exception as exc:  # the agent's failure is its episode's, never the run's
            finished.put((i, Outcome(error=f"{type(exc).__name__}: {exc}")))

    while True:
        while len(deadlines) < concurrency and (i := next(waiting, None)) is not None:
            deadlines[i] = time.monotonic() + timeouts[i]
            threading.Thread(target=run, args=(i,), name=f"agent-{i}", daemon=True).start()
        if not deadlines:
            return outcomes
        try:
            i, outcome = finished.get(timeout=max(0.0, min(deadlines.values()) - time.monotonic()))
            if deadlines.pop(i, None) is not None:  # else it ran out of time before
                outcomes[i] = outcome
        except queue.Empty:
            for i in [i for i, deadline in deadlines.items() if deadline <= time.monotonic()]:
                del deadlines[i]
                on_timeout(i)
                outcomes[i] = Outcome(error=f"timed out after {timeouts[i]:g}s")


def is_linear(calls: list[Call]) -> bool:
    """Whether every call's prompt continues the previous call's prompt and completion."""
    for earlier, later in zip(calls, calls[1:]):
        so_far = earlier.prompt_ids + earlier.completion_ids
        if later.prompt_ids[: len(so_far)] != so_far:
            return False
    return True


def linear_rollout(problem: Problem, calls: list[Call], text: str, version: int, tokenizer: Any) -> Rollout:
    """One rollout of a linear conversation: the calls' sampled tokens trained, each turn
    followed by what the agent inserted before the next call (loss weight 0)."""
    prompt = calls[0].prompt_ids
    ids: list[int] = []
    logprobs: list[float] = []
    mask: list[int] = []
    turns: list[Turn] = []
    for call in calls:
        inserted = call.prompt_ids[len(prompt) + len(ids):]
        if turns:
            turns[-1].observation = tokenizer.decode(inserted)
            turns[-1].observation_ids = inserted
        ids += inserted + call.completion_ids
        logprobs += [0.0] * len(inserted) + call.logprobs
        mask += [0] * len(inserted) + [1] * len(call.completion_ids)
        turns.append(Turn(text=call.text, start=len(ids) - len(call.completion_ids), end=len(ids),
                          finish_reason=call.finish_reason))
    return Rollout(problem=problem, prompt_ids=prompt, completion_ids=ids, logprobs=logprobs, text=text,
                   finish_reason=calls[-1].finish_reason, policy_version=version, loss_mask=mask, turns=turns)


def episode_rollouts(problem: Problem, calls: list[Call], text: str, version: int, tokenizer: Any,
                     empty_prompt: list[int]) -> list[Rollout]:
    """An episode's training data (see the module docstring); the caller puts its rewards and
    counters on the turns."""
    if not calls:
        return [Rollout(problem=problem, prompt_ids=empty_prompt, completion_ids=[], logprobs=[], text=text,
                        finish_reason="stop", policy_version=version, turns=[Turn("", 0, 0, "stop")])]
    if is_linear(calls):
        return [linear_rollout(problem, calls, text, version, tokenizer)]
    return [Rollout(problem=problem, prompt_ids=c.prompt_ids, completion_ids=c.completion_ids, logprobs=c.logprobs,
                    text=text, finish_reason=c.finish_reason, policy_version=version,
                    turns=[Turn(c.text, 0, len(c.completion_ids), c.finish_reason)]) for c in calls]


class AgentGenerator(WrappingGenerator):
    """Plays the problems of the tasks in ``agents`` (task name -> settings) with their agents
    against a recording endpoint over ``sampler``; other problems go to ``inner`` (a generator
    over the same sampler)."""

    def __init__(self, inner: Any, sampler: TokenSampler, agents: dict[str, AgentSettings]):
        super().__init__(inner, sampler)
        self.agents = agents
        self._http: Optional[OpenAIHTTPServer] = None

    def generate(self, problems: list[Problem], group_size: int, params: SamplingParams,
                 policy_version: int = 0, generator: Optional[torch.Generator] = None) -> list[Group]:
        """``group_size`` episodes per problem, in problem order; an episode may give several
        rollouts (see the module docstring)."""
        return split_generate(problems, set(self.agents),
                              lambda chosen: self.play(chosen, group_size, params, policy_version, generator),
                              lambda rest: self.inner.generate(rest, group_size, params, policy_version, generator))

    def play(self, problems: list[Problem], group_size: int, params: SamplingParams, policy_version: int = 0,
             generator: Optional[torch.Generator] = None) -> list[Group]:
        http = self._server()
        app: RecordingServer = http.app
        app.batcher.version = policy_version  # what the replies tell the agents
        episodes = [p for p in problems for _ in range(group_size)]
        settings = [self.agents[p.task] for p in episodes]
        recordings = [Recording(params, draw_seed(generator), s.max_calls)
                      for s in settings]
        keys = [app.open(r) for r in recordings]
        work = [partial(s.agent, f"{http.url}/episodes/{key}/v1", p) for s, key, p in zip(settings, keys, episodes)]
        outcomes = run_all(work, max(s.concurrency for s in settings), [s.timeout_s for s in settings],
                           lambda i: recordings[i].close())
        for key in keys:
            app.close(key)
        outcomes = [_scored(p, s, r.calls, o) for p, s, r, o in zip(episodes, settings, recordings, outcomes)]
        _report(episodes, outcomes)
        rollouts = [self._rollouts(p, s, r.calls, o, policy_version)
                    for p, s, r, o in zip(episodes, settings, recordings, outcomes)]
        return [Group(p, [r for made in rollouts[k * group_size:(k + 1) * group_size] for r in made])
                for k, p in enumerate(problems)]

    def _rollouts(self, problem: Problem, settings: AgentSettings, calls: list[Call], outcome: Outcome,
                  version: int) -> list[Rollout]:
        """The episode's rollouts with its score and counters on their turns: the score on
        every rollout (each shares the episode's outcome), the counters once."""
        answer = "" if outcome.error is not None or outcome.answer is None else str(outcome.answer)
        rewards = {} if settings.reward is None else {"agent": outcome.score}
        rollouts = episode_rollouts(problem, calls, answer, version, self.tokenizer,
                                    self.encode_prompt(problem.prompt) if not calls else [])
        for rollout in rollouts:
            rollout.turns[-1].rewards = dict(rewards)
        rollouts[0].turns[-1].info = {"agent_calls": float(len(calls)), "agent_errors": float(outcome.error is not None)}
        return rollouts

    def _server(self) -> OpenAIHTTPServer:
        """The recording endpoint, started on first use."""
        if self._http is None:
            self._http = serve_in_background(RecordingServer(self.sampler, self.sampler.batch_size))
        return self._http


def _scored(problem: Problem, settings: AgentSettings, calls: list[Call], outcome: Outcome) -> Outcome:
    """``outcome`` with the ``reward`` function's score, when there is one and the agent succeeded."""
    if outcome.error is not None or settings.reward is None:
        return outcome
    try:
        return replace(outcome, score=float(settings.reward(problem, outcome.answer, calls)))
    except Exception as exc:  # the user's reward failing is the episode's, never the run's
        return Outcome(error=f"reward: {type(exc).__name__}: {exc}")


def _report(episodes: list[Problem], outcomes: list[Outcome]) -> None:
    """One line on stderr for a call with failed episodes: how many, and the first's error."""
    failed = [(p, o.error) for p, o in zip(episodes, outcomes) if o.error is not None]
    if failed:
        problem, error = failed[0]
        print(f"agents: {len(failed)} of {len(episodes)} episodes failed (scored 0); first, {problem.key}: {error}",
              file=sys.stderr)


def with_agents(generator: Any, sampler: TokenSampler, agents: dict[str, AgentSettings]) -> Any:
    """``generator`` with the tasks in ``agents`` played by their agents; itself when there are none."""
    return AgentGenerator(generator, sampler, agents) if agents else generator
