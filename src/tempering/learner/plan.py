"""The learner's update plan: which rows an update computes and how they become forward passes.

Every work-saving choice of a learner update is made here, once, by :func:`plan_update`, a
pure function of the (mini-)batch's tensors and a few yes/no facts the learner supplies
(:class:`PlanChoices`); no model runs. The learner executes the plan, and every pass over
the same rows (the proximal pass and each update of a step) executes the same plan. The
choices, each exact (the update is unchanged up to floating-point summation order) and each
proved so by a test that compares against computing everything:

- **skip** (``tests/unit/test_skip_rows.py``): rows whose advantages are all 0 are left out,
  when the learner says each row's loss stands alone and vanishes at zero advantage;
- **merge** (``tests/unit/test_merge_rows.py``): identical rows are computed once, weighted by
  their count, under the same condition;
- **micro-batches** (``tests/unit/test_packing.py``): runs of ``micro_batch_size`` rows, or at
  most ``token_budget`` tokens each, keeping a prompt's rows together when they can share it,
  and a group's rows together when the loss pairs them (``keep_groups``;
  ``tempering.learner.packing``);
- **layout** of each micro-batch (``tests/unit/test_packing.py``,
  ``tests/unit/test_shared_prompts.py``): padded rows, packed rows, or shared prompts when
  that computes fewer tokens than the padded or packed rows
  (``tempering.learner.forward``), with log-probs ``chunk`` tokens of logits at a time.

Callers without a plan (one forward pass over some rows) get the same layout choice from
:func:`layout_of`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

import torch

from tempering.learner.packing import (distinct_prompts, first_fit_decreasing, plan_group_micro_batches,
                                       plan_micro_batches, plan_shared_micro_batches)
from tempering.types import Batch


class Layout(enum.Enum):
    """How a micro-batch's rows are laid out for the model (``tempering.learner.forward``)."""

    PADDED = "padded"
    PACKED = "packed"
    SHARED = "shared"


@dataclass(frozen=True, kw_only=True)
class PlanChoices:
    """What the plan may do; the learner folds in the facts about its losses and model."""

    skip_zero_advantage: bool
    """Leave out rows without signal (the learner sets it only when each row's loss stands alone)."""
    merge_duplicates: bool
    """Compute identical rows once (the learner sets it only when each row's loss stands alone)."""
    share_prompts: bool
    """Rows may share their prompt's pass (the learner sets it only when the model can)."""
    packing: bool
    token_budget: int
    """Tokens per micro-batch (rows x width as the model sees them); 0 = ``micro_batch_size`` rows."""
    micro_batch_size: int
    chunk: int
    """Tokens of logits at a time; 0 = the model's whole logits at once."""
    keep_groups: bool = False
    """A group's rows (``Batch.group_B``) share one micro-batch (the loss pairs them)."""


@dataclass(frozen=True)
class MicroBatch:
    """One forward and backward pass: which of the plan's computed rows, laid out how."""

    rows: list[int]
    """Indices into :attr:`UpdatePlan.rows`."""
    layout: Layout
    chunk: int


@dataclass(frozen=True)
class UpdatePlan:
    """The rows a (mini-)batch's update computes and the passes that compute them."""

    rows: list[int]
    """Rows of the batch computed, in the order the micro-batches index them."""
    counts: Optional[list[int]]
    """How many identical rows each computed row stands for; None when nothing was merged."""
    source: list[int]
    """For each row of the batch, the computed row that holds its values; -1 when skipped."""
    skipped: int
    merged: int
    micro_batches: list[MicroBatch]


def plan_update(batch: Batch, choices: PlanChoices) -> UpdatePlan:
    """The plan of one update on ``batch``: skip, then merge, then cut into micro-batches, then
    lay each out."""
    kept = _rows_with_signal(batch) if choices.skip_zero_advantage else list(range(len(batch)))
    places = _merge_duplicates(batch, kept) if choices.merge_duplicates else list(range(len(kept)))
    rows: list[int] = []
    source = [-1] * len(batch)
    for row, place in zip(kept, places):
        if place == len(rows):  # places are numbered in order of first appearance
            rows.append(row)
        source[row] = place
    counts = [places.count(place) for place in range(len(rows))] if len(rows) < len(kept) else None
    return UpdatePlan(rows, counts, source, len(batch) - len(kept), len(kept) - len(rows),
                      _micro_batches(batch, rows, choices))


def computed_batch(batch: Batch, plan: UpdatePlan) -> Batch:
    """The rows ``plan`` computes, merged rows' policy loss weighted by their counts."""
    device = batch.input_ids_BT.device
    computed = batch.select(torch.tensor(plan.rows, dtype=torch.long, device=device))
    if plan.counts is not None:
        counts_B = torch.tensor(plan.counts, dtype=torch.float32, device=device)
        computed.weights_B = counts_B if computed.weights_B is None else computed.weights_B * counts_B
    return computed


def _rows_with_signal(batch: Batch) -> list[int]:
    """Rows with a nonzero advantage on a trained token; at least one row is kept, so that the
    update still runs (AdamW moves the weights on its momentum even with a zero gradient) and
    reports its metrics."""
    signal_B = ((batch.advantages_BT != 0) & (batch.loss_mask_BT > 0)).any(dim=1)
    rows = torch.nonzero(signal_B)[:, 0].tolist()
    return rows or [0]


def _row_contents(batch: Batch) -> list[bytes]:
    """Each row's everything the loss reads, as bytes: tokens and length, trained-token mask,
    advantages, the sampler's log-probs (bitwise: the sampler decodes rows with the same
    tokens as one, so a group's identical samples have the same), proximal log-probs, policy
    version and weight."""
    parts = [batch.input_ids_BT * batch.attention_mask_BT, batch.attention_mask_BT, batch.loss_mask_BT,
             batch.advantages_BT, batch.old_logprobs_BT, batch.policy_versions_B[:, None]]
    parts += [t for t in (batch.prox_logprobs_BT, None if batch.weights_B is None else batch.weights_B[:, None])
              if t is not None]
    rows_BF = torch.cat([part.double() for part in parts], dim=1).cpu().numpy()
    return [row.tobytes() for row in rows_BF]


def _merge_duplicates(batch: Batch, kept: list[int]) -> list[int]:
    """For each of the ``kept`` rows, its place among the rows computed: the place of the first
    kept row with the same content."""
    contents = _row_contents(batch)
    first: dict[bytes, int] = {}
    return [first.setdefault(contents[row], len(first)) for row in kept]


def _micro_batches(batch: Batch, rows: list[int], choices: PlanChoices) -> list[MicroBatch]:
    """The computed rows cut into micro-batches (``tempering.learner.packing``; with ``keep_groups``,
    ``plan_group_micro_batches``; with a token budget and prompts to share,
    ``plan_shared_micro_batches``, so that a prompt's rows stay together), each with its layout."""
    lengths = batch.attention_mask_BT[rows].sum(dim=1).tolist()
    prompt_of = prompt_lengths = None
    if choices.share_prompts and batch.prompt_lengths_B is not None:
        _, prompt_of_B = distinct_prompts(batch.input_ids_BT, batch.prompt_lengths_B)
        prompt_of = [prompt_of_B[row] for row in rows]
        prompt_lengths = batch.prompt_lengths_B[rows].tolist()
    if choices.keep_groups and batch.group_B is not None:
        cuts = plan_group_micro_batches(batch.group_B[rows].tolist(), lengths, choices.token_budget,
                                        choices.micro_batch_size)
    elif choices.token_budget > 0 and prompt_of is not None and len(set(prompt_of)) < len(prompt_of):
        cuts = plan_shared_micro_batches(prompt_of, prompt_lengths, lengths, choices.token_budget)
    else:
        cuts = plan_micro_batches(lengths, choices.token_budget, choices.packing, choices.micro_batch_size)

    def part(values: Optional[list[int]], cut: list[int]) -> Optional[list[int]]:
        return None if values is None else [values[i] for i in cut]

    return [MicroBatch(cut, choose_layout(part(lengths, cut), max(part(lengths, cut)), choices.packing,
                                          part(prompt_of, cut), part(prompt_lengths, cut)), choices.chunk)
            for cut in cuts]


def choose_layout(lengths: list[int], width: int, packing: bool, prompt_of: Optional[list[int]] = None,
                  prompt_lengths: Optional[list[int]] = None) -> Layout:
    """The layout of one micro-batch of rows of ``lengths`` tokens, right-padded to ``width``:
    shared prompts when they may be shared (``prompt_of`` given: which distinct prompt each
    row has, of ``prompt_lengths`` tokens) and that computes fewer tokens than the rows would
    (completions are right-padded to the longest), else packed or padded as ``packing`` says.

    >>> choose_layout([6, 6, 7], 7, False, [0, 0, 0], [4, 4, 4])
    <Layout.SHARED: 'shared'>
    >>> choose_layout([5, 2, 7], 7, True, [0, 0, 0], [1, 1, 1])
    <Layout.PACKED: 'packed'>
    """
    width_packed = max(lengths)
    unshared = len(first_fit_decreasing(lengths, width_packed)) * width_packed if packing else len(lengths) * width
    if prompt_of is not None and _shared_tokens(lengths, prompt_of, prompt_lengths) < unshared:
        return Layout.SHARED
    return Layout.PACKED if packing else Layout.PADDED


def _shared_tokens(lengths: list[int], prompt_of: list[int], prompt_lengths: list[int]) -> float:
    """Tokens the shared layout computes: each distinct prompt once, as wide as the longest,
    and every completion, as wide as the longest; infinite when there is no layout to share
    (no prompt repeated, or a row without a prompt or without a completion)."""
    reach = [length - prompt for length, prompt in zip(lengths, prompt_lengths)]
    prompts = len(set(prompt_of))
    if prompts == len(prompt_of) or min(prompt_lengths) < 1 or min(reach) < 1:
        return float("inf")
    return prompts * max(prompt_lengths) + len(lengths) * max(reach)


def layout_of(input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, packing: bool,
              prompt_lengths_B: Optional[torch.Tensor] = None) -> Layout:
    """:func:`choose_layout` for one pass over right-padded rows, for callers without a plan;
    ``prompt_lengths_B`` only when the model can share prompts."""
    prompt_of = prompt_lengths = None
    if prompt_lengths_B is not None:
        prompt_of, prompt_lengths = distinct_prompts(input_ids_BT, prompt_lengths_B)[1], prompt_lengths_B.tolist()
    return choose_layout(attention_mask_BT.sum(dim=1).tolist(), input_ids_BT.shape[1], packing, prompt_of,
                         prompt_lengths)
