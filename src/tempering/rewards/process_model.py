"""The ``process_model`` reward: a learned process reward model (PRM) scores each step.

A step is a non-empty line of the completion (:func:`split_steps`). The PRM is a causal
language model with a one-output token-classification head, as ``temper prm train`` saves
it: it reads the prompt and the steps (:func:`step_tokens`) and its output on each step's
last token, through a sigmoid, is the probability that a solution continued from that step
still reaches a right answer. The aggregation (:data:`AGGREGATIONS`: ``min``, ``product``,
``last``, ``mean``) turns the step probabilities into one score in [0, 1].

The same layout of tokens is used in training and in scoring: the prompt as the sampler
encodes it, then each step and its newline encoded on its own. For a character-level
tokenizer that is exactly the sampled text; for a subword one it can split a line's first
word differently from the sampler, the same way in training and in scoring.

Not done here: steps other than lines (sentences, a delimiter token), several devices.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tempering.rewards.base import RewardResult, build_reward, register_reward
from tempering.rewards.model import load_reward_model
from tempering.types import Problem, Prompt, Rollout

Aggregation = Callable[[Sequence[float]], float]


def aggregate_min(step_probs: Sequence[float]) -> float:
    """The weakest step: a solution is only as sound as its worst step.

    >>> aggregate_min([0.9, 0.2, 0.8])
    0.2
    """
    return min(step_probs)


def aggregate_product(step_probs: Sequence[float]) -> float:
    """Every step sound at once, the steps taken as independent.

    >>> round(aggregate_product([0.9, 0.5, 0.8]), 6)
    0.36
    """
    return math.prod(step_probs)


def aggregate_last(step_probs: Sequence[float]) -> float:
    """The last step's value: the PRM's estimate for the whole solution.

    >>> aggregate_last([0.1, 0.7])
    0.7
    """
    return step_probs[-1]


def aggregate_mean(step_probs: Sequence[float]) -> float:
    """The mean step value: lenient to one weak step among many.

    >>> aggregate_mean([0.2, 0.4, 0.9])
    0.5
    """
    return sum(step_probs) / len(step_probs)


AGGREGATIONS: dict[str, Aggregation] = {"min": aggregate_min, "product": aggregate_product,
                                        "last": aggregate_last, "mean": aggregate_mean}
"""Aggregation name -> how step probabilities (at least one) become one score."""


def split_steps(completion: str) -> list[str]:
    """The steps of a completion: its non-empty lines, as written.

    >>> split_steps("7+8=15\\n\\n4+3+1=8\\nanswer: 85")
    ['7+8=15', '4+3+1=8', 'answer: 85']
    """
    return [line for line in completion.splitlines() if line.strip()]


def prompt_ids(tokenizer: Any, prompt: Prompt) -> list[int]:
    """The prompt's token ids as a sampler encodes them: text as it is; chat messages with the
    tokenizer's chat template and the assistant's turn marker, or one per line without one."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return list(tokenizer("\n".join(m["content"] for m in prompt) + "\n")["input_ids"])


def step_tokens(tokenizer: Any, prompt: Prompt, steps: Sequence[str], max_length: int) -> tuple[list[int], list[int]]:
    """``(ids, ends)``: the prompt then each step with its newline, and the index of each
    step's last token. Past ``max_length`` tokens the prompt's start is cut; a step that would
    start before the cut is dropped from ``ends`` (the caller sees fewer ends than steps).

    >>> from tempering.models.tiny import build_tokenizer
    >>> ids, ends = step_tokens(build_tokenizer(), "1+2\\n", ["1+2=3", "answer: 3"], 64)
    >>> len(ids), ends
    (21, [10, 20])
    """
    ids = prompt_ids(tokenizer, prompt)
    ends = []
    for step in steps:
        ids += tokenizer(step + "\n", add_special_tokens=False)["input_ids"]
        ends.append(len(ids) - 1)
    cut = max(0, len(ids) - max_length)
    return ids[cut:], [end - cut for end in ends if end - cut >= 0]


def step_logits(model: Any, tokenizer: Any, rows: Sequence[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    """The head's output at each row's step ends (one tensor per row), the rows right-padded
    into one forward pass."""
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids_BT = torch.full((len(rows), width), pad, dtype=torch.long)
    mask_BT = torch.zeros((len(rows), width), dtype=torch.long)
    for b, (ids, _) in enumerate(rows):
        ids_BT[b, :len(ids)] = torch.tensor(ids)
        mask_BT[b, :len(ids)] = 1
    device = next(model.parameters()).device
    logits_BT = model(input_ids=ids_BT.to(device), attention_mask=mask_BT.to(device)).logits[..., 0].float()
    return [logits_BT[b, torch.tensor(ends, dtype=torch.long, device=device)] for b, (_, ends) in enumerate(rows)]


@register_reward("process_model")
class ProcessModelReward:
    """Scores each step with a PRM and aggregates them into one score in [0, 1].

    ``path``: the PRM (a folder ``temper prm train`` saved). ``aggregation``: a key of
    :data:`AGGREGATIONS`. ``device``: empty = CUDA when available, else CPU. A completion
    without a step scores 0. ``gate``: an outcome reward's name (``exact_match``); the PRM's
    score is multiplied by that reward's, so that it only ranks right answers among themselves.
    A policy can learn to write steps a PRM over-values; gated, such steps earn nothing unless
    the answer is right, and the PRM's value cannot outweigh the outcome.
    """

    def __init__(self, *, path: str, aggregation: str = "min", batch_size: int = 32, device: str = "",
                 max_length: int = 1024, gate: str = ""):
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}")
        if batch_size < 1 or max_length < 2:
            raise ValueError(f"batch_size must be at least 1 and max_length at least 2, got {batch_size}, {max_length}")
        self.aggregate, self.batch_size, self.max_length = AGGREGATIONS[aggregation], batch_size, max_length
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model, self.tokenizer = load_reward_model(path, head="token")
        self.model.to(self.device).eval()
        self._lock = threading.Lock()
        self.gate = build_reward(gate) if gate else None

    def step_probs(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[list[float]]:
        """Each completion's step probabilities (empty for one without a step)."""
        rows = [step_tokens(self.tokenizer, p.prompt, split_steps(c), self.max_length)
                for p, c in zip(problems, completions)]
        found: list[list[float]] = [[] for _ in rows]
        scored = [i for i, (_, ends) in enumerate(rows) if ends]
        with self._lock, torch.inference_mode():
            for start in range(0, len(scored), self.batch_size):
                chunk = scored[start:start + self.batch_size]
                for i, logits in zip(chunk, step_logits(self.model, self.tokenizer, [rows[i] for i in chunk])):
                    found[i] = torch.sigmoid(logits).tolist()
        return found

    def score_batch(self, problems: Sequence[Problem], rollouts: Sequence[Rollout]) -> list[RewardResult]:
        probs = self.step_probs(problems, [r.text for r in rollouts])
        found = [RewardResult(self.aggregate(p) if p else 0.0, diagnostics={"steps": len(p)}) for p in probs]
        if self.gate is None:
            return found
        gates = self.gate.score_batch(problems, rollouts)
        return [RewardResult(r.score * g.score, diagnostics={**r.diagnostics, "gate": g.score}, error=g.error)
                for r, g in zip(found, gates)]
