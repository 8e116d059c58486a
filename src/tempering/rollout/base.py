"""What the rest of tempering asks of a sampler: the :class:`Generator` protocol.

A generator turns problems into groups of sampled completions, keeping for every
completion token the exact id the model drew and its log-probability under the
temperature-scaled distribution, stamped with the policy version that sampled it. The
pipeline's rollout worker, held-out evaluation and the benchmarks speak only to this
protocol, so another way of sampling (an inference server, a multi-turn environment around
a generator) plugs in without touching them. :class:`tempering.rollout.hf.HFGenerator` is
a KV-cached decoding loop over a Hugging Face model in this process;
:class:`tempering.rollout.remote.ServerGenerator` samples on an OpenAI-compatible
inference server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol, runtime_checkable

import torch

from tempering.types import Group, Problem


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn. Training sets the first fields; the penalties, ``logit_bias`` and
    the stopping rules after ``greedy`` come from ``temper serve``'s requests, and the
    penalties and bias change the distribution whose log-probs are recorded (the learner
    applies neither, so a run leaves them off)."""

    temperature: float = 1.0
    top_p: float = 1.0
    """Nucleus mass; 1 = off. Decides which tokens can be drawn, not the recorded log-probs."""
    max_new_tokens: int = 64
    stop: tuple[str, ...] = field(default_factory=tuple)
    """Strings that end a completion (kept in it)."""
    greedy: bool = False
    top_k: int = 0
    """Draw among the k most likely tokens; 0 = off. Like top_p, not in the recorded log-probs."""
    min_p: float = 0.0
    """Draw only tokens at least this share of the most likely one's probability; 0 = off."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token the completion holds so far; 0 = off."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time the completion holds it; 0 = off."""
    repetition_penalty: float = 1.0
    """Logits of tokens in the prompt or completion so far divided by it (positive ones) or
    multiplied by it (negative ones); 1 = off."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """``(token id, bias)`` pairs added to the logits."""
    min_tokens: int = 0
    """Tokens drawn before an end-of-sequence, stop token or stop string may end a completion."""
    ignore_eos: bool = False
    """Keep sampling past end-of-sequence tokens (stop tokens and strings still end it)."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end a completion besides the end-of-sequence ones (kept in it)."""
    max_prompt_tokens: int = 0
    """Longest prompt, in tokens; 0 = the model's context minus ``max_new_tokens``
    (``tempering.rollout.prompts``)."""
    long_prompts: str = "truncate"
    """What a longer prompt gets: "error", "truncate" (keep its last tokens) or "skip"; training
    passes ``rollout.long_prompts``, evaluation truncates."""


def draw_seed(generator: Optional[torch.Generator]) -> int:
    """One request seed from ``generator`` (torch's default stream without one), for a sampler
    that sends each prompt as a request of its own seed."""
    return int(torch.randint(0, 2**62, (1,), generator=generator))


class RowStreams:
    """Random streams of their own for groups of rows sampled together: row ``b`` draws from
    ``generators[owner_B[b]]``, and each stream gives its live rows their numbers in row
    order. What a group draws then depends only on its own rows, not on what else shares the
    batch: ``temper serve`` gathers concurrent requests into one call, each request with its
    own seed, and a request sampled alone gets the same tokens."""

    def __init__(self, generators: list[torch.Generator], owner_B: list[int]):
        self.generators = generators
        self.owner_B = torch.tensor(owner_B)

    def uniform(self, row_B: torch.Tensor) -> torch.Tensor:
        """One uniform number in [0, 1) for each row of ``row_B`` (ascending), from its stream."""
        owner_B = self.owner_B[row_B.cpu()]
        order_B = torch.argsort(owner_B, stable=True)  # each stream's rows together, in row order
        owners, counts = torch.unique_consecutive(owner_B[order_B], return_counts=True)
        uniform_B = torch.empty(len(row_B))
        if not len(row_B):
            return uniform_B
        uniform_B[order_B] = torch.cat([torch.rand(count, generator=self.generators[k])
                                        for k, count in zip(owners.tolist(), counts.tolist())])
        return uniform_B

    def seeds(self) -> list[int]:
        """One seed for each row, in row order, from its stream: for a sampler that sends each
        row as a request of its own seed (vLLM, a server), where a row's draws happen elsewhere."""
        return [draw_seed(self.generators[k]) for k in self.owner_B.tolist()]


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
               generator: Optional[torch.Generator | RowStreams] = None) -> list[tuple[list[int], list[float], str]]:
        """``(completion ids, log-probs, finish reason "stop" | "length")`` after each prompt;
        draws from ``generator``, or with :class:`RowStreams` from each row's own stream."""
        ...


class ServerError(RuntimeError):
    """The inference server could not be reached or refused a request; the message says which and why.
    Here, beside the protocol, so that the pipeline can pass it on as it is without importing
    the server client."""
