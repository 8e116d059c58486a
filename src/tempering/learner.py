"""One optimisation step on a batch: recompute log-probs, loss, optional KL, step the optimizer.

The learner owns the policy's trainable state (model, optimizer, LR schedule, policy
version) and nothing else: batches arrive with advantages already computed. Micro-batches
accumulate gradients; aggregation is normalised by whole-batch counts, so the step does not
depend on the micro-batch size beyond floating-point summation order.

Not done here: several updates per batch, value heads, packing and chunked log-probs.
"""

from __future__ import annotations

import copy
import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from tempering.algorithms import kl_estimate, token_logprobs
from tempering.algorithms.losses import AggregationFn, LossFn, LossInputs, masked_mean
from tempering.types import Batch, Rollout


def lr_factor(step: int, warmup: int, total: int, schedule: str = "cosine", min_ratio: float = 0.1) -> float:
    """Learning-rate multiplier: linear warm-up over ``warmup`` steps, then ``schedule``.

    >>> [round(lr_factor(s, 2, 6, "linear", 0.0), 2) for s in range(7)]
    [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    """
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def collate(rollouts: list[Rollout], pad_id: int) -> Batch:
    """Right-padded batch of prompt+completion rows with per-token mask and old log-probs."""
    width = max(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
    n = len(rollouts)
    input_ids_BT = torch.full((n, width), pad_id, dtype=torch.long)
    attention_BT = torch.zeros((n, width), dtype=torch.long)
    loss_mask_BT = torch.zeros((n, width))
    old_logprobs_BT = torch.zeros((n, width))
    for row, r in enumerate(rollouts):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        input_ids_BT[row, : p + c] = torch.tensor(r.prompt_ids + r.completion_ids)
        attention_BT[row, : p + c] = 1
        loss_mask_BT[row, p : p + c] = torch.tensor(r.loss_mask, dtype=torch.float32)
        old_logprobs_BT[row, p : p + c] = torch.tensor(r.logprobs)
    return Batch(
        input_ids_BT=input_ids_BT, attention_mask_BT=attention_BT, loss_mask_BT=loss_mask_BT,
        old_logprobs_BT=old_logprobs_BT * loss_mask_BT, advantages_BT=torch.zeros((n, width)),
        policy_versions_B=torch.tensor([r.policy_version for r in rollouts]),
    )


@dataclass
class LearnerSettings:
    loss: LossFn
    aggregation: AggregationFn
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    temperature: float = 1.0
    micro_batch_size: int = 64
    grad_clip: float = 1.0
    bf16: bool = False


class Learner:
    def __init__(self, model: Any, optimizer: torch.optim.Optimizer,
                 schedule: Callable[[int], float], settings: LearnerSettings):
        self.model = model
        self.optimizer = optimizer
        self.settings = settings
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        self.reference: Optional[Any] = None
        if settings.kl_coef > 0:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        self.version = 0

    def _autocast(self):
        return torch.autocast("cpu", dtype=torch.bfloat16) if self.settings.bf16 else nullcontext()

    def _micro_step(self, micro: Batch, tokens: int, sequences: int) -> dict[str, float]:
        s = self.settings
        with self._autocast():
            logprobs_BT, entropy_BT = token_logprobs(
                self.model, micro.input_ids_BT, micro.attention_mask_BT, s.temperature, with_entropy=True)
        mask_BT = micro.loss_mask_BT
        loss_BT, metrics = s.loss(LossInputs(
            logprobs_BT=logprobs_BT, old_logprobs_BT=micro.old_logprobs_BT,
            advantages_BT=micro.advantages_BT, mask_BT=mask_BT, clip_low=s.clip_low, clip_high=s.clip_high))
        if self.reference is not None:
            with torch.no_grad(), self._autocast():
                ref_BT, _ = token_logprobs(self.reference, micro.input_ids_BT, micro.attention_mask_BT, s.temperature)
            kl_BT = kl_estimate(logprobs_BT, ref_BT, s.kl_estimator)
            loss_BT = loss_BT + s.kl_coef * kl_BT
            metrics["kl"] = masked_mean(kl_BT.detach(), mask_BT)
        loss = s.aggregation(loss_BT, mask_BT, tokens, sequences)
        loss.backward()
        metrics["loss"] = float(loss.detach())
        metrics["entropy"] = masked_mean(entropy_BT, mask_BT)
        return metrics

    def step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step over the whole batch; returns metrics (token-weighted means)."""
        self.model.train()
        tokens, sequences = batch.num_tokens, len(batch)
        totals: dict[str, float] = {}
        for start in range(0, sequences, self.settings.micro_batch_size):
            micro = batch.select(slice(start, start + self.settings.micro_batch_size))
            weight = micro.num_tokens / max(tokens, 1)
            for key, value in self._micro_step(micro, tokens, sequences).items():
                totals[key] = totals.get(key, 0.0) + (value if key == "loss" else value * weight)
        clip = self.settings.grad_clip if self.settings.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        totals["grad_norm"] = float(grad_norm)
        totals["lr"] = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        self.version += 1
        return totals
