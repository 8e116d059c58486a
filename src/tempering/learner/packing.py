"""How the learner cuts a batch into forward passes: packing, token budgets, a memory budget.

**Packing.** Right-padded rows waste compute on padding. Packed, the sequences of a
micro-batch are laid end to end in rows as wide as the longest of them (first-fit
decreasing), with position ids that restart at 0 for each sequence and no attention mask;
transformers then builds a block-diagonal causal mask from the position ids (its
``find_packed_sequence_indices``), so every sequence sees exactly what it would see alone.
The model must be called with ``use_cache=False``: with a cache, transformers ignores the
packing and lets sequences attend to each other. Rows are kept as wide as the longest
sequence rather than one flat row for the whole micro-batch because attention's cost grows
with the square of the row width and CPU attention kernels compute masked-out blocks too:
one flat row of N tokens costs N^2.

**Token budgets.** A micro-batch holds at most ``token_budget`` tokens as the model sees
them (packed rows x width, or padded rows x width), not a fixed number of sequences, so a
batch of long completions is cut finer than a batch of short ones. The step does not depend
on the cut (aggregation is normalised by whole-batch counts, see ``tempering.learner.step``).

**Memory budget.** :func:`tokens_for_memory` turns a budget in GB into a token budget from
the model's shape: fixed costs (weights, gradients and AdamW state of the trained ones,
frozen models, one chunk of logits) and activation bytes per token, with or without gradient checkpointing. It is an
estimate from tensor sizes, not a measurement; ``bench/memory.py`` measures.

Not done: splitting one sequence across rows or micro-batches (a sequence longer than the
budget gets a micro-batch of its own), variable-length attention kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tempering.models.compat import attention_shape


@dataclass
class Packing:
    """Sequences of right-padded rows laid end to end in ``R`` rows of width ``W``."""

    input_ids_RW: torch.Tensor
    position_ids_RW: torch.Tensor
    """Each sequence counts from 0; the padding at a row's end counts from 0 too, as one more
    (ignored) sequence, so that it attends to nothing real."""
    index_BT: torch.Tensor
    """Where the token at ``[b, t]`` went: ``r * W + c`` in the packed rows; -1 on padding."""


def first_fit_decreasing(lengths: list[int], width: int) -> list[list[int]]:
    """Indices of ``lengths`` in bins holding at most ``width`` each (a longer item gets its own).

    >>> first_fit_decreasing([3, 5, 2, 4, 1], 6)
    [[1, 4], [3, 2], [0]]
    """
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        slot = next((b for b, free in enumerate(room) if free >= lengths[i]), None)
        if slot is None:
            bins.append([])
            room.append(max(width, lengths[i]))
            slot = len(bins) - 1
        bins[slot].append(i)
        room[slot] -= lengths[i]
    return bins


def pack(input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> Packing:
    """Pack right-padded rows into rows as wide as the longest sequence."""
    lengths = attention_mask_BT.sum(dim=1).tolist()
    width = max(lengths)
    bins = first_fit_decreasing(lengths, width)
    device = input_ids_BT.device
    input_ids_RW = torch.zeros((len(bins), width), dtype=input_ids_BT.dtype, device=device)
    position_ids_RW = torch.zeros((len(bins), width), dtype=torch.long, device=device)
    index_BT = torch.full(input_ids_BT.shape, -1, dtype=torch.long, device=device)
    counts_W = torch.arange(width, device=device)
    for r, members in enumerate(bins):
        column = 0
        for b in members:
            n = lengths[b]
            input_ids_RW[r, column : column + n] = input_ids_BT[b, :n]
            position_ids_RW[r, column : column + n] = counts_W[:n]
            index_BT[b, :n] = r * width + column + counts_W[:n]
            column += n
        position_ids_RW[r, column:] = counts_W[: width - column]
    return Packing(input_ids_RW, position_ids_RW, index_BT)


def plan_micro_batches(lengths: list[int], token_budget: int, packing: bool, max_rows: int) -> list[list[int]]:
    """Row indices of each micro-batch of a batch whose sequences have ``lengths`` tokens.

    Without a budget (``token_budget <= 0``): consecutive runs of ``max_rows`` rows. With one:
    packed, groups of packed rows (as :func:`pack` makes them, width = the longest sequence)
    holding at most ``token_budget`` tokens of rows x width; padded, rows from the longest
    down, as many as fit ``rows x longest <= token_budget``. A micro-batch holds at least one
    sequence, even one longer than the budget.

    >>> plan_micro_batches([3, 5, 2, 4, 1], 12, packing=True, max_rows=64)
    [[1, 3, 4], [0, 2]]
    >>> plan_micro_batches([3, 5, 2, 4, 1], 12, packing=False, max_rows=64)
    [[1, 3], [0, 2, 4]]
    """
    if token_budget <= 0:
        return [list(range(start, min(start + max_rows, len(lengths)))) for start in range(0, len(lengths), max_rows)]
    if packing:
        width = max(lengths)
        bins = first_fit_decreasing(lengths, width)
        per_micro = max(1, token_budget // width)
        return [[i for members in bins[start : start + per_micro] for i in members]
                for start in range(0, len(bins), per_micro)]
    micro_batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        current = micro_batches[-1] if micro_batches else None
        if current is None or (len(current) + 1) * lengths[current[0]] > token_budget:
            micro_batches.append([i])
        else:
            current.append(i)
    return micro_batches


def plan_group_micro_batches(group_of: list[int], lengths: list[int], token_budget: int,
                             max_rows: int) -> list[list[int]]:
    """Row indices of each micro-batch, never splitting a group: whole groups in order of
    first appearance, as many as fit ``max_rows`` rows (without a budget) or ``token_budget``
    tokens of rows x the longest (with one: the padded cost, which the layout the learner
    picks never exceeds). A group that does not fit alone gets a micro-batch of its own.

    >>> plan_group_micro_batches([0, 0, 1, 1, 2, 2], [3, 4, 5, 2, 3, 3], 0, 4)
    [[0, 1, 2, 3], [4, 5]]
    >>> plan_group_micro_batches([0, 0, 1, 1, 2, 2], [3, 4, 5, 2, 3, 3], 12, 64)
    [[0, 1], [2, 3], [4, 5]]
    """
    members: dict[int, list[int]] = {}
    for row, group in enumerate(group_of):
        members.setdefault(group, []).append(row)
    plans: list[list[int]] = []
    for rows in members.values():
        joined = (plans[-1] if plans else []) + rows
        fits = (len(joined) * max(lengths[r] for r in joined) <= token_budget if token_budget > 0
                else len(joined) <= max_rows)
        if plans and fits:
            plans[-1] = joined
        else:
            plans.append(list(rows))
    return plans


def distinct_prompts(input_ids_BT: torch.Tensor, prompt_lengths_B: torch.Tensor) -> tuple[list[tuple], list[int]]:
    """The distinct prompts of right-padded rows (their first ``prompt_lengths_B`` tokens), in
    order of first appearance, and which of them each row has."""
    index_of: dict[tuple, int] = {}
    prompt_of = [index_of.setdefault(tuple(input_ids_BT[b, :n].tolist()), len(index_of))
                 for b, n in enumerate(prompt_lengths_B.tolist())]
    return list(index_of), prompt_of


def plan_shared_micro_batches(prompt_of_B: list[int], prompt_lengths: list[int], lengths: list[int],
                              token_budget: int) -> list[list[int]]:
    """Row indices of each micro-batch, keeping rows that continue the same prompt together.

    For rows whose prompts are shared (``tempering.learner.forward.share_prompts``): the
    cost of a micro-batch is its shared layout, each distinct prompt once, as wide as the
    longest, plus every row's completion, as wide as the longest. Prompt groups are taken
    from the longest completion down, as many as fit ``token_budget``; a group that does not
    fit alone is cut into runs of rows that do (at least one row each). The layout that then
    runs costs at most this (the learner takes it or a cheaper one).

    >>> plan_shared_micro_batches([0, 0, 0, 1, 1], [2, 2, 2, 3, 3], [5, 6, 4, 7, 5], 16)
    [[1, 0, 2], [3, 4]]
    >>> plan_shared_micro_batches([0, 0, 0, 1, 1], [2, 2, 2, 3, 3], [5, 6, 4, 7, 5], 10)
    [[1, 0], [2], [3], [4]]
    """
    members: dict[int, list[int]] = {}
    for row, prompt in enumerate(prompt_of_B):
        members.setdefault(prompt, []).append(row)
    reach = [length - prompt for length, prompt in zip(lengths, prompt_lengths)]
    for rows in members.values():
        rows.sort(key=lambda r: -reach[r])
    order = sorted(members, key=lambda g: -reach[members[g][0]])
    plans: list[list[int]] = []
    current: list[int] = []
    prompts: set[int] = set()

    def cost(rows: list[int], groups: set[int]) -> int:
        return (len(groups) * max(prompt_lengths[members[g][0]] for g in groups)
                + len(rows) * max(reach[r] for r in rows))

    for group in order:
        if current and cost(current + members[group], prompts | {group}) <= token_budget:
            current += members[group]
            prompts.add(group)
            continue
        if current:
            plans.append(current)
        current, prompts = [], {group}
        for row in members[group]:  # alone, cut where it overflows
            if current and cost(current + [row], prompts) > token_budget:
                plans.append(current)
                current = []
            current.append(row)
    if current:
        plans.append(current)
    return plans


FP32 = 4
RUNTIME_BYTES = 512 * 1024**2
"""Resident size of Python, torch and transformers themselves before any model (measured: about
400 MB for a process that has loaded SmolLM2, its 540 MB of weights aside)."""


def activation_bytes_per_token(config: Any, gradient_checkpointing: bool) -> int:
    """Bytes the backward pass keeps per token of a decoder-only transformer, in fp32.

    Per layer without checkpointing: two RMSNorms (input and normalised output, 2H each),
    attention (q, k, v before and after rotary embedding, output, the projected output: about
    5H + 4 H_kv) and the gated MLP (gate, up, activation, product: 4I). With checkpointing,
    only each layer's input (H) is kept, plus one layer's worth while it is recomputed.
    """
    hidden = config.hidden_size
    layers = config.num_hidden_layers
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    _, kv_heads, head_dim = attention_shape(config)
    kv_hidden = kv_heads * head_dim
    per_layer = 9 * hidden + 4 * kv_hidden + 4 * intermediate
    kept = layers * hidden + per_layer if gradient_checkpointing else layers * per_layer
    return FP32 * (kept + 2 * hidden)


def parameter_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def memory_costs(model: Any, gradient_checkpointing: bool, logprob_chunk: int,
                 frozen_parameters: int = 0) -> tuple[int, int]:
    """``(fixed bytes, bytes per token)`` of a learner step on ``model``, estimated from tensor sizes.

    Fixed: the runtime itself (:data:`RUNTIME_BYTES`), the weights (4 bytes per fp32
    parameter), gradients and AdamW's two moments for the trainable ones (12 more bytes each;
    with LoRA, the adapters only), 4 bytes per parameter of frozen models beside the policy
    (a reference model, a teacher), and one chunk of logits (logits,
    probabilities and their gradient: 3 x chunk x vocab floats; the whole micro-batch's when
    ``logprob_chunk`` is 0, counted per token then). Per token: :func:`activation_bytes_per_token`.
    """
    config = model.config
    parameters = parameter_count(model)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    fixed = RUNTIME_BYTES + FP32 * (parameters + 3 * trainable + frozen_parameters)
    per_token = activation_bytes_per_token(config, gradient_checkpointing)
    if logprob_chunk > 0:
        fixed += 3 * FP32 * logprob_chunk * config.vocab_size
    else:
        per_token += 3 * FP32 * config.vocab_size
    return fixed, per_token


def tokens_for_memory(budget_gb: float, model: Any, gradient_checkpointing: bool, logprob_chunk: int,
                      frozen_parameters: int = 0) -> int:
    """The largest micro-batch, in tokens, whose learner step should fit in ``budget_gb``
    (:func:`memory_costs`). Raises ValueError when the fixed costs alone exceed the budget."""
    fixed, per_token = memory_costs(model, gradient_checkpointing, logprob_chunk, frozen_parameters)
    budget = budget_gb * 1024**3
    if budget <= fixed:
        raise ValueError(f"{budget_gb} GB does not hold the runtime and the model's weights, gradients and "
                         f"optimizer state (about {fixed / 1024**3:.2f} GB); raise it or set 0 to turn the budget off")
    return int((budget - fixed) // per_token)
