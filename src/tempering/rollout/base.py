"""What the rest of tempering asks of a sampler: the :class:`Generator` protocol.

A generator turns problems into groups of sampled completions, keeping for every
completion token the exact id the model drew and its log-probability under the
temperature-scaled distribution, stamped with the policy version that sampled it. The
pipeline's rollout worker, held-out evaluation and the benchmarks speak only to this
protocol, so another way of sampling (an inference server, a multi-turn environment around
a generator) plugs in without touching them. :class:`tempering.rollout.hf.HFGenerator` is
a KV-cached decoding loop over a Hugging Face model in this process;
:class:`tempering.rollout.openai_server.ServerGenerator` samples on an OpenAI-compatible
inference server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol, runtime_checkable

import torch

from tempering.types import Group, Problem, Rollout


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    """Nucleus mass; 1 = off. Decides which tokens can be drawn, not the recorded log-probs."""
    max_new_tokens: int = 64
    stop: tuple[str, ...] = field(default_factory=tuple)
    """Strings that end a completion (kept in it)."""
    greedy: bool = False
    max_prompt_tokens: int = 0
    """Longest prompt, in tokens; 0 = the model's context minus ``max_new_tokens``
    (``tempering.rollout.prompts``)."""
    long_prompts: str = "truncate"
    """What a longer prompt gets: "error", "truncate" (keep its last tokens) or "skip"; training
    passes ``rollout.long_prompts``, evaluation truncates."""


@runtime_checkable
class Generator(Protocol):
    """Samples groups of completions with exact token ids and log-probs."""

    def generate(self, problems: list[Problem], group_size: int, params: SamplingParams,
                 policy_version: int = 0, generator: Optional[torch.Generator] = None) -> list[Group]:
        """``group_size`` rollouts for each problem, in problem order, stamped ``policy_version``;
        random draws come from ``generator`` (the caller's seeded stream)."""
        ...

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Take new policy weights (a state dict, possibly partial). An empty dict means the
        generator already shares the learner's tensors and only the version moves."""
        ...


@runtime_checkable
class TokenSampler(Protocol):
    """A generator that continues token histories directly, what a multi-turn episode needs
    (``tempering.envs.runner``): every turn continues the exact ids of the turns before it."""

    tokenizer: object
    chat_template: bool
    context_length: int
    """Positions the model attends over; 0 = unknown (no bound is applied)."""
    batch_size: int
    """Rows one ``sample`` call should hold at most."""

    def sample(self, prompts: list[list[int]], params: SamplingParams,
               generator: Optional[torch.Generator] = None) -> list[tuple[list[int], list[float], str]]:
        """``(completion ids, log-probs, finish reason "stop" | "length")`` after each prompt."""
        ...


def sampled_groups(problems: list[Problem], prompts: list[list[int]],
                   outputs: list[list[tuple[list[int], list[float], str]]], tokenizer: object,
                   policy_version: int) -> list[Group]:
    """One group per problem from what a sampler drew after its prompt: ``outputs[i]`` holds
    problem ``i``'s completions as ``(token ids, log-probs, finish reason)``."""
    return [Group(problem, [Rollout(
        problem=problem, prompt_ids=prompt_ids, completion_ids=ids, logprobs=logprobs, finish_reason=reason,
        policy_version=policy_version, text=tokenizer.decode(ids, skip_special_tokens=True))
        for ids, logprobs, reason in drawn]) for problem, prompt_ids, drawn in zip(problems, prompts, outputs)]


def request_seeds(count: int, generator: Optional[torch.Generator]) -> list[int]:
    """One seed per request of an engine that seeds each request, drawn in order from the run's
    stream before any is sent, so what each request draws does not depend on what it was batched with."""
    return [int(torch.randint(0, 2**62, (1,), generator=generator)) for _ in range(count)]
