"""Batched sampling with a Hugging Face causal LM, keeping exact token ids and log-probs.

The sampler is a plain KV-cached decoding loop rather than ``model.generate``: it records,
for every sampled token, its log-probability under the temperature-scaled distribution,
which is what the learner recomputes (``tempering.algorithms.logprobs``) to form importance
ratios. Top-p truncation changes which tokens can be drawn, not the recorded log-probs.

Prompts are left-padded with explicit position ids, so a row's numbers do not depend on
what it was batched with (up to floating-point summation order).

Not done here: removing finished rows from the running batch and sharing a prompt's
prefill across its group; finished rows keep decoding padding until the batch is done.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Optional

import torch

from tempering.config import ConfigError
from tempering.types import Group, Problem, Prompt, Rollout


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = field(default_factory=tuple)
    greedy: bool = False


def _top_p_filter(probs_BV: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail of each distribution beyond cumulative mass ``top_p`` (keeping >= 1 token)."""
    sorted_BV, order_BV = probs_BV.sort(dim=-1, descending=True)
    outside_BV = sorted_BV.cumsum(dim=-1) - sorted_BV > top_p
    sorted_BV = sorted_BV.masked_fill(outside_BV, 0.0)
    return torch.zeros_like(probs_BV).scatter(-1, order_BV, sorted_BV)


class HFGenerator:
    """Samples completions from ``model``; one instance per policy copy."""

    def __init__(self, model, tokenizer, chat_template: Optional[bool] = None, batch_size: int = 256):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        has_template = bool(getattr(tokenizer, "chat_template", None))
        self.chat_template = has_template if chat_template is None else chat_template
        if self.chat_template and not has_template:
            raise ConfigError("model.chat_template is true but this model's tokenizer has no chat "
                              "template; set model.chat_template=false (or null) for it")
        self.eos_ids = self._eos_ids()
        forward_args = inspect.signature(model.forward).parameters
        # transformers 5 renamed past_key_values to cache; older releases know only the old name.
        self._cache_arg = "cache" if "cache" in forward_args else "past_key_values"
        self._keep_arg = next((a for a in ("logits_to_keep", "num_logits_to_keep") if a in forward_args), None)

    def _eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        config_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        ids.update(config_eos if isinstance(config_eos, list) else [config_eos])
        return {i for i in ids if i is not None}

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str) and not self.chat_template:
            return self.tokenizer(prompt)["input_ids"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if not self.chat_template:
            return self.tokenizer("\n".join(m["content"] for m in messages) + "\n")["input_ids"]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def generate(
        self,
        problems: list[Problem],
        group_size: int,
        params: SamplingParams,
        policy_version: int = 0,
        generator: Optional[torch.Generator] = None,
    ) -> list[Group]:
        """``group_size`` completions for each problem, in problem order."""
        prompts = [self.encode_prompt(p.prompt) for p in problems]
        flat = [(i, prompts[i]) for i in range(len(problems)) for _ in range(group_size)]
        rollouts: list[Rollout] = []
        for start in range(0, len(flat), self.batch_size):
            chunk = flat[start : start + self.batch_size]
            outputs = self._sample([ids for _, ids in chunk], params, generator)
            for (i, prompt_ids), (completion, logprobs, reason) in zip(chunk, outputs):
                rollouts.append(Rollout(
                    problem=problems[i], prompt_ids=prompt_ids, completion_ids=completion,
                    logprobs=logprobs, finish_reason=reason, policy_version=policy_version,
                    text=self.tokenizer.decode(completion, skip_special_tokens=True),
                ))
        return [Group(p, rollouts[i * group_size : (i + 1) * group_size]) for i, p in enumerate(problems)]

    @torch.no_grad()
    def _sample(self, prompts: list[list[int]], params: SamplingParams, generator):
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        width = max(len(p) for p in prompts)
        input_ids_BT = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask_BT = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        positions_BT = (mask_BT.cumsum(-1) - 1).clamp(min=0)
        n = len(prompts)
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        reasons: list[Optional[str]] = [None] * n
        keep = {self._keep_arg: 1} if self._keep_arg else {}
        out = self.model(input_ids=input_ids_BT, attention_mask=mask_BT, position_ids=positions_BT,
                         use_cache=True, **keep)
        for step in range(params.max_new_tokens):
            logits_BV = out.logits[:, -1, :].float()
            next_B, logprob_B = self._pick(logits_BV, params, generator)
            for row in range(n):
                if reasons[row] is None:
                    self._append(row, int(next_B[row]), float(logprob_B[row]), tokens, logprobs, reasons, params)
            if all(r is not None for r in reasons) or step == params.max_new_tokens - 1:
                break
            mask_BT = torch.cat([mask_BT, torch.ones(n, 1, dtype=mask_BT.dtype)], dim=1)
            positions_B1 = positions_BT[:, -1:] + 1
            positions_BT = torch.cat([positions_BT, positions_B1], dim=1)
            out = self.model(input_ids=next_B[:, None], attention_mask=mask_BT, position_ids=positions_B1,
                             use_cache=True, **{self._cache_arg: out[self._cache_arg]})
        return [(t, lp, r or "length") for t, lp, r in zip(tokens, logprobs, reasons)]

    @staticmethod
    def _pick(logits_BV: torch.Tensor, params: SamplingParams, generator):
        if params.greedy:
            next_B = logits_BV.argmax(dim=-1)
            return next_B, torch.log_softmax(logits_BV, dim=-1).gather(-1, next_B[:, None])[:, 0]
        logp_BV = torch.log_softmax(logits_BV / params.temperature, dim=-1)
        probs_BV = logp_BV.exp()
        if params.top_p < 1.0:
            probs_BV = _top_p_filter(probs_BV, params.top_p)
        next_B = torch.multinomial(probs_BV, 1, generator=generator)[:, 0]
        return next_B, logp_BV.gather(-1, next_B[:, None])[:, 0]

    def _append(self, row, token, logprob, tokens, logprobs, reasons, params) -> None:
        tokens[row].append(token)
        logprobs[row].append(logprob)
        if token in self.eos_ids:
            reasons[row] = "stop"
        elif params.stop:
            # Every token decodes to at least one character, so the last L tokens hold
            # any stop string of length <= L that the newest token completed.
            tail = self.tokenizer.decode(tokens[row][-max(map(len, params.stop)):], skip_special_tokens=True)
            if any(s in tail for s in params.stop):
                reasons[row] = "stop"
