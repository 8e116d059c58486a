"""The optimizer, its learning-rate schedule and its one guarded step, shared by every command
that trains weights.

``adamw`` builds the optimizer (fused where torch has it); ``lr_factor`` is the schedule's
multiplier (linear warm-up, then cosine, linear or constant); :func:`guarded_step` clips the
gradients and takes the step unless the loss or the gradient is not finite. RL
(``tempering.learner.step``), SFT, pre-training and reward-model training all step through it;
:func:`shuffled_epochs` is the whole loop of the reward-model commands. Not here: what a step computes, or what to do about repeated skipped steps (the loops decide).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch


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


def adamw(model, lr: float, betas: tuple[float, float], weight_decay: float) -> torch.optim.AdamW:
    """AdamW over the model's trainable parameters (with LoRA, the adapters), as one fused kernel
    where torch has it for their device (CPU and CUDA: the same update, several times faster
    than the per-tensor loop on a small model)."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in parameters)
    return torch.optim.AdamW(parameters, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused or None)


def guarded_step(optimizer: torch.optim.Optimizer, loss: float, grad_clip: float) -> tuple[float, bool]:
    """Clip the gradients of the optimizer's parameters to norm ``grad_clip`` (0: measured, not
    clipped), then step, unless ``loss`` or the gradient norm is not finite: that step is
    skipped, never applied, since one NaN would reach every weight. The gradients are cleared
    either way. Returns the norm before clipping and whether the step was taken."""
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    norm = torch.nn.utils.clip_grad_norm_(parameters, grad_clip if grad_clip > 0 else float("inf"))
    grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # fsdp: a DTensor
    stepped = math.isfinite(loss) and math.isfinite(grad_norm)
    if stepped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, stepped


def shuffled_epochs(model: torch.nn.Module, optimizer: torch.optim.Optimizer, items: Sequence[Any],
                    loss_of: Callable[[list], torch.Tensor], epochs: int, batch_size: int, max_steps: int, seed: int,
                    progress: Optional[Callable[[int, float], None]] = None) -> list[float]:
    """``epochs`` passes over ``items`` in a seeded shuffled order, one guarded step (gradients
    clipped to norm 1) per ``batch_size`` of them, stopping after ``max_steps`` (0 = none); the
    loss of every step, in order. The reward-model commands' loop: one loss, no schedule."""
    rng = random.Random(seed)
    losses: list[float] = []
    for _ in range(epochs):
        order = list(items)
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            if max_steps and len(losses) >= max_steps:
                return losses
            model.train()
            loss = loss_of(order[start:start + batch_size])
            loss.backward()
            losses.append(loss.item())
            guarded_step(optimizer, losses[-1], grad_clip=1.0)
            if progress is not None:
                progress(len(losses), losses[-1])
    return losses
