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

Partial rollouts (``tempering.pipeline``, with ``updates`` and ``partial_chunk`` set): a round's
requests ask for ``partial_chunk`` tokens first; then ``updates`` may load new weights onto the
engine (a server is reloaded between its requests' chunks), and every completion that is not
finished is continued by a request of its own, its prompt and tokens so far as the prompt, for
the tokens left, seeded from the run's stream again. The engine computes that prefix again
under the weights it holds, so each token after the reload is drawn by the new weights given
its whole prefix and carries their log-prob and version (``Rollout.versions``). Not done: a
stop string that spans the two chunks is not seen (each chunk's request looks for it in its
own tokens); one reload per round.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional

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
    updates: Optional[Callable[[int], Optional[int]]] = None
    """Partial rollouts: told how many decoding steps each completion advanced, may load new
    weights and returns their version, or None (see the module docstring)."""
    partial_chunk = 0
    """Partial rollouts: the tokens of a round's first requests (0: whole completions)."""

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.chat_template)

    def generate(self, problems: list[Problem], group_size: int, params: SamplingParams,
                 policy_version: int = 0, generator: Optional[torch.Generator] = None) -> list[Group]:
        """``group_size`` completions for each problem (one request each, ``n=group_size``)."""
        limit = params.max_prompt_tokens or (max(1, self.context_length - params.max_new_tokens)
                                             if self.context_length else 0)
        prompts = [fit_prompt(self.encode_prompt(p.prompt), p, limit, params.long_prompts) for p in problems]
        chunk = self.partial_chunk if self.updates is not None else 0
        if not 0 < chunk < params.max_new_tokens:
            outputs = self._complete_all(prompts, group_size, params, _seeds(len(prompts), generator))
            versions = [[[] for _ in drawn] for drawn in outputs]  # every token the rollout's version
        else:
            outputs, versions = self._in_chunks(prompts, group_size, params, chunk, policy_version, generator)
        return [Group(problem, [Rollout(
            problem=problem, prompt_ids=prompt_ids, completion_ids=ids, logprobs=logprobs, finish_reason=reason,
            policy_version=policy_version, text=self.tokenizer.decode(ids, skip_special_tokens=True),
            versions=token_versions) for (ids, logprobs, reason), token_versions in zip(drawn, row_versions)])
            for problem, prompt_ids, drawn, row_versions in zip(problems, prompts, outputs, versions)]

    def _in_chunks(self, prompts: list[list[int]], n: int, params: SamplingParams, chunk: int, version: int,
                   generator: Optional[torch.Generator]) -> tuple[list[list[Drawn]], list[list[list[int]]]]:
        """``n`` completions of each prompt, ``chunk`` tokens first, then (after ``updates``) the
        rest of each unfinished one; with each token's version."""
        first = self._complete_all(prompts, n, replace(params, max_new_tokens=chunk), _seeds(len(prompts), generator))
        newer = self.updates(chunk)
        later = version if newer is None else newer
        unfinished = [(i, j) for i, drawn in enumerate(first) for j, (_, _, reason) in enumerate(drawn)
                      if reason == "length"]
        rest = self._complete_all([prompts[i] + first[i][j][0] for i, j in unfinished], 1,
                                  replace(params, max_new_tokens=params.max_new_tokens - chunk),
                                  _seeds(len(unfinished), generator))
        outputs = [list(drawn) for drawn in first]
        versions = [[[version] * len(ids) for ids, _, _ in drawn] for drawn in first]
        for (i, j), [(ids, logprobs, reason)] in zip(unfinished, rest):
            head, head_logprobs, _ = outputs[i][j]
            ends = self._stop_across(head, ids, params)
            if ends is not None:
                ids, logprobs, reason = ids[:ends], logprobs[:ends], "stop"
            outputs[i][j] = (head + ids, head_logprobs + logprobs, reason)
            versions[i][j] += [later] * len(ids)
        return outputs, versions

    def _stop_across(self, head: list[int], tail: list[int], params: SamplingParams) -> Optional[int]:
        """How many of ``tail``'s tokens to keep when a stop string of ``params`` begins in
        ``head`` and ends in ``tail``; None when none does. (One that ``head`` holds whole was
        passed over for ``min_tokens``.)"""
        if not params.stop:
            return None
        # Every token decodes to at least one character, so a stop string of L characters that
        # spans the join lies in head's last L - 1 tokens and tail's first L - 1.
        longest = max(map(len, params.stop))
        before = head[-(longest - 1):] if longest > 1 else []
        joined_at = len(self.tokenizer.decode(before, skip_special_tokens=True))
        for ends in range(max(1, params.min_tokens - len(head)), min(longest - 1, len(tail)) + 1):
            text = self.tokenizer.decode(before + tail[:ends], skip_special_tokens=True)
            if any(text.find(stop, max(0, joined_at - len(stop) + 1)) >= 0 for stop in params.stop):
                return ends
        return None

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
