"""Multi-turn episodes with exact tokens: a :class:`~tempering.rollout.base.Generator` that
plays a task's problems in its environment and hands the rest to the sampler it wraps.

Every turn continues the episode's token ids as they are: the prompt, each model turn exactly
as drawn, and each observation encoded once when it arrives. Nothing already in the episode
is decoded and encoded again, so the learner recomputes log-probs over the very sequence the
sampler conditioned on (a text round trip can merge or split tokens at a turn boundary and
train the model on a sequence it never produced). The environment's tokens get log-prob 0
and loss weight 0.

Observations (see :mod:`tempering.envs.base`): a string is encoded alone (no special tokens)
and appended inside the model's turn; chat messages become new turns. For those,
:class:`ChatTurns` learns once from the chat template how it closes an assistant turn (the
end-of-turn token and what follows it) and how it renders the new messages plus the next
assistant marker, by rendering probe conversations and taking differences; the model's own
end-of-turn token, when it drew one, is kept and not repeated. Without a chat template the
messages' contents are appended one per line.

An episode ends when the environment says so, at ``max_turns``, when a turn is cut off by
the token budget (``max_new_tokens`` per turn; ``max_tokens`` per episode, and the model's
context), or when an observation would not fit in what is left.

Episodes of one call run in lockstep: each round samples the next turn of every live episode
in one batched call (episodes with the same stop strings and budget together), so the
sampler's batching and its shared prefill of a group's common prompt work as in one turn.
Draws come from the caller's generator in a fixed order, so an episode replays exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import torch

from tempering.config import ConfigError, EnvSpec
from tempering.envs.base import Environment, Observation, make_env
from tempering.rollout.base import SamplingParams, TokenSampler
from tempering.rollout.prompts import chat_ids, encode_prompt, fit_prompt
from tempering.types import Group, Messages, Problem, Rollout, Turn


class ChatTurns:
    """Token ids the chat template puts between a model turn and the next, learned from probes.

    ``close`` holds the ids the template writes after an assistant message's content (the
    end-of-turn token, often a newline after it); :meth:`observation_ids` renders new messages
    and the next assistant marker as the template would after a closed turn.
    """

    _PROBE: Messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]

    def __init__(self, tokenizer: Any, tools: Optional[list] = None):
        self.tokenizer, self.tools = tokenizer, tools
        opened = self._render(self._PROBE[:1], True)
        self.closed = self._render(self._PROBE, False)
        body = self._after(opened, self.closed, "the assistant's turn")
        content = tokenizer("Hello", add_special_tokens=False)["input_ids"]
        at = _find(body, content)
        if at < 0:
            raise ConfigError("this chat template changes an assistant message's text when it renders it; "
                              "multi-turn episodes cannot tell where a turn ends (set model.chat_template=false)")
        self.close = body[at + len(content):]

    def _render(self, messages: Messages, generation_prompt: bool) -> list[int]:
        return chat_ids(self.tokenizer, messages, generation_prompt, self.tools)

    @staticmethod
    def _after(prefix: list[int], ids: list[int], what: str) -> list[int]:
        if ids[: len(prefix)] != prefix:
            raise ConfigError(f"this chat template renders a conversation differently once {what} follows it, "
                              "so turns cannot be appended as tokens; multi-turn episodes need a template "
                              "that only appends (set model.chat_template=false to use plain text)")
        return ids[len(prefix):]

    def observation_ids(self, messages: Messages, turn_ids: list[int]) -> list[int]:
        """What follows a model turn ending in ``turn_ids``: the rest of the template's close
        (all of it when the model did not end its turn itself), the messages, the next marker."""
        opened = self._after(self.closed, self._render([*self._PROBE, *messages], True), "a new message")
        drew_end = bool(self.close) and turn_ids[-1:] == self.close[:1]
        return (self.close[1:] if drew_end else self.close) + opened


def _find(ids: list[int], part: list[int]) -> int:
    """Index of the first occurrence of ``part`` in ``ids``, or -1."""
    for i in range(len(ids) - len(part) + 1):
        if ids[i : i + len(part)] == part:
            return i
    return -1


@dataclass
class Episode:
    """One episode in play: its token history after the prompt and what each turn was."""

    problem: Problem
    env: Environment
    spec: EnvSpec
    prompt_ids: list[int]
    budget: int
    """Completion tokens the episode may still add."""
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    done: bool = False

    def add(self, ids: list[int], logprobs: list[float], trained: bool) -> None:
        self.ids += ids
        self.logprobs += logprobs
        self.mask += [int(trained)] * len(ids)
        self.budget -= len(ids)

    def rollout(self, policy_version: int) -> Rollout:
        last = self.turns[-1]
        return Rollout(problem=self.problem, prompt_ids=self.prompt_ids, completion_ids=self.ids,
                       logprobs=self.logprobs, text=last.text, finish_reason=last.finish_reason,
                       policy_version=policy_version, loss_mask=self.mask, turns=self.turns)


class WrappingGenerator:
    """A generator that plays some tasks itself with ``sampler`` and hands the rest to ``inner``
    (a generator over the same sampler, which takes the weights); tokenizer, batch size and
    prompt encoding are the sampler's."""

    def __init__(self, inner: Any, sampler: Any):
        self.inner, self.sampler = inner, sampler
        self.tokenizer, self.batch_size = sampler.tokenizer, sampler.batch_size

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.inner.load_weights(weights)

    def close(self) -> None:
        if hasattr(self.inner, "close"):
            self.inner.close()

    def encode_prompt(self, prompt) -> list[int]:
        return self.sampler.encode_prompt(prompt)


class EpisodeGenerator(WrappingGenerator):
    """Plays problems of the tasks in ``envs`` (task name -> :class:`EnvSpec`) as episodes
    with ``sampler``; other problems go to ``sampler.generate`` unchanged."""

    def __init__(self, sampler: TokenSampler, envs: dict[str, EnvSpec]):
        super().__init__(sampler, sampler)
        self.envs = envs
        self._chat_turns: dict[str, ChatTurns] = {}

    def generate(self, problems: list[Problem], group_size: int, params: SamplingParams,
                 policy_version: int = 0, generator: Optional[torch.Generator] = None) -> list[Group]:
        """``group_size`` rollouts per problem, in problem order (a Generator's contract)."""
        def play(chosen: list[Problem]) -> list[Group]:
            rollouts = self.play(chosen, group_size, params, policy_version, generator)
            return [Group(p, rollouts[k * group_size : (k + 1) * group_size]) for k, p in enumerate(chosen)]

        return split_generate(problems, set(self.envs), play,
                              lambda rest: self.sampler.generate(rest, group_size, params, policy_version, generator))

    def play(self, problems: list[Problem], group_size: int, params: SamplingParams, policy_version: int = 0,
             generator: Optional[torch.Generator] = None) -> list[Rollout]:
        """``group_size`` episodes of each problem, played to the end; their rollouts in order."""
        episodes = [self._start(p, params) for p in problems for _ in range(group_size)]
        while live := [e for e in episodes if not e.done]:
            batches: dict[tuple, list[Episode]] = {}
            for e in live:
                limit = min(params.max_new_tokens, e.budget)
                batches.setdefault((tuple(getattr(e.env, "stop", ())), limit), []).append(e)
            for (stop, limit), same in batches.items():
                turn_params = replace(params, stop=tuple(dict.fromkeys(params.stop + stop)), max_new_tokens=limit)
                for start in range(0, len(same), self.batch_size):  # the sampler's rows per call, as in one turn
                    batch = same[start : start + self.batch_size]
                    outputs = self.sampler.sample([e.prompt_ids + e.ids for e in batch], turn_params, generator)
                    for episode, (ids, logprobs, reason) in zip(batch, outputs):
                        self._advance(episode, ids, logprobs, reason)
        return [e.rollout(policy_version) for e in episodes]

    def _start(self, problem: Problem, params: SamplingParams) -> Episode:
        spec = self.envs[problem.task]
        env = make_env(spec.name, spec.options, self.tokenizer)
        prompt = env.reset(problem)
        ids = encode_prompt(self.tokenizer, prompt, self.sampler.chat_template, getattr(env, "tools", None))
        context = self.sampler.context_length
        limit = params.max_prompt_tokens or (max(1, context - params.max_new_tokens) if context else 0)
        ids = fit_prompt(ids, problem, limit, params.long_prompts)
        budget = spec.max_tokens or spec.max_turns * params.max_new_tokens
        if context:
            budget = min(budget, context - len(ids))
        return Episode(problem, env, spec, ids, budget)

    def _advance(self, episode: Episode, ids: list[int], logprobs: list[float], reason: str) -> None:
        """Record a model turn, let the environment answer, and insert its observation."""
        start = len(episode.ids)
        episode.add(ids, logprobs, trained=True)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        turn = Turn(text=text, start=start, end=len(episode.ids), finish_reason=reason)
        episode.turns.append(turn)
        if reason == "length":  # cut off mid-turn: nothing complete to act on
            episode.done = True
            return
        step = self._step(episode, text)
        turn.rewards, turn.info = dict(step.rewards), dict(step.info)
        if step.done or len(episode.turns) >= episode.spec.max_turns:
            episode.done = True
            return
        observed = self._observation_ids(episode, step.observation, ids, text)
        if len(observed) >= episode.budget:  # no room left for the model to answer it
            episode.done = True
            return
        turn.observation, turn.observation_ids = step.observation, observed
        episode.add(observed, [0.0] * len(observed), trained=False)

    @staticmethod
    def _step(episode: Episode, text: str):
        try:
            return episode.env.step(text)
        except Exception as exc:
            raise RuntimeError(f"environment {episode.spec.name!r} failed on {episode.problem.key} "
                               f"(turn {len(episode.turns)}): {type(exc).__name__}: {exc}") from exc

    def _observation_ids(self, episode: Episode, observation: Observation, turn_ids: list[int], text: str) -> list[int]:
        if not observation:
            return []
        if isinstance(observation, str):
            return self.tokenizer(observation, add_special_tokens=False)["input_ids"]
        if not self.sampler.chat_template:
            lines = "\n".join(m["content"] for m in observation) + "\n"
            return self.tokenizer(lines if text.endswith("\n") else "\n" + lines, add_special_tokens=False)["input_ids"]
        return self._turns_for(getattr(episode.env, "tools", None)).observation_ids(observation, turn_ids)

    def _turns_for(self, tools: Optional[list]) -> ChatTurns:
        key = json.dumps(tools, sort_keys=True)
        if key not in self._chat_turns:
            self._chat_turns[key] = ChatTurns(self.tokenizer, tools)
        return self._chat_turns[key]


def split_generate(problems: list[Problem], tasks: set[str], play: Callable[[list[Problem]], list[Group]],
                   rest: Callable[[list[Problem]], list[Group]]) -> list[Group]:
    """The groups of ``problems`` in order: those of ``tasks`` made by ``play``, the others by
    ``rest`` (called first, so the draws of a seeded stream keep their order)."""
    played = [i for i, p in enumerate(problems) if p.task in tasks]
    plain = [i for i, p in enumerate(problems) if p.task not in tasks]
    groups: dict[int, Group] = {}
    if plain:
        groups.update(zip(plain, rest([problems[i] for i in plain])))
    if played:
        groups.update(zip(played, play([problems[i] for i in played])))
    return [groups[i] for i in range(len(problems))]


def with_envs(sampler: Any, envs: dict[str, EnvSpec]) -> Any:
    """``sampler`` wrapped to play the tasks in ``envs`` as episodes; itself when there are none."""
    return EpisodeGenerator(sampler, envs) if envs else sampler
