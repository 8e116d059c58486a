"""What the samplers that send each problem as one request share: a vLLM or inference server,
remote (``tempering.rollout.remote``) or in this process (``tempering.rollout.vllm_engine``).

A :class:`RequestSampler` is a :class:`~tempering.rollout.base.Generator` and a
:class:`~tempering.rollout.base.TokenSampler`: it renders and tokenizes prompts here, fits
them to the context, asks its engine for ``n = group_size`` completions of each prompt with
the prompt's own seed, and keeps the engine's token ids and log-probs as they are. The seeds
are drawn in order from the run's stream before any request is sent, so what each request
draws does not depend on what the engine batched it with. The engine's side is one method,
``_complete_all``, which applies the temperature, top-p, token budget, stop strings and stop
token ids of :class:`~tempering.rollout.base.SamplingParams` (a run sets no other field; an
agent's calls add stop token ids, ``tempering.envs.recording``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from tempering.rollout.base import RowStreams, SamplingParams, draw_seed
from tempering.rollout.prompts import encode_prompt, fit_prompt
from tempering.types import Group, Problem, Prompt, Rollout

Drawn = tuple[list[int], list[float], str]
"""One completion: its token ids, their log-probs, and the finish reason, "stop" or "length"."""


class RequestSampler:
    """Generation over ``_complete_all``; a subclass sets ``tokenizer``, ``chat_template`` (as
    ``use_chat_template`` decided it) and ``context_length`` (0 = unbounded)."""

    tokenizer: Any
    chat_template: bool
    context_length: int

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.chat_template)

    def generate(self, problems: list[Problem], group_size: int, params: SamplingParams,
                 policy_version: int = 0, generator: Optional[torch.Generator] = None) -> list[Group]:
        """``group_size`` completions for each problem (one request each, ``n=group_size``)."""
        limit = params.max_prompt_tokens or (max(1, self.context_length - params.max_new_tokens)
                                             if self.context_length else 0)
        prompts = [fit_prompt(self.encode_prompt(p.prompt), p, limit, params.long_prompts) for p in problems]
        outputs = self._complete_all(prompts, group_size, params, _seeds(len(prompts), generator))
        return [Group(problem, [Rollout(
            problem=problem, prompt_ids=prompt_ids, completion_ids=ids, logprobs=logprobs, finish_reason=reason,
            policy_version=policy_version, text=self.tokenizer.decode(ids, skip_special_tokens=True))
            for ids, logprobs, reason in drawn]) for problem, prompt_ids, drawn in zip(problems, prompts, outputs)]

    def sample(self, prompts: list[list[int]], params: SamplingParams,
               generator: Optional[torch.Generator | RowStreams] = None) -> list[Drawn]:
        """``(completion ids, log-probs, finish reason)`` after each prompt (one request each),
        seeded from ``generator``, or with :class:`~tempering.rollout.base.RowStreams` each from
        its row's own stream (what ``temper serve``'s batcher gives, e.g. for an agent's calls)."""
        seeds = generator.seeds() if isinstance(generator, RowStreams) else _seeds(len(prompts), generator)
        return [outputs[0] for outputs in self._complete_all(prompts, 1, params, seeds)]

    def _complete_all(self, prompts: list[list[int]], n: int, params: SamplingParams,
                      seeds: list[int]) -> list[list[Drawn]]:
        """``n`` completions of each prompt, the i-th request seeded with ``seeds[i]``."""
        raise NotImplementedError


def _seeds(count: int, generator: Optional[torch.Generator]) -> list[int]:
    return [draw_seed(generator) for _ in range(count)]
