"""The update plan on hand-made batches: which rows are computed, merged copies and their
counts, micro-batches and each one's layout. Pure: no model runs. That each choice leaves the
update unchanged is proved by the exactness tests named in ``tempering.learner.plan``."""

import torch
from test_learner import PAD, _rollout

from tempering.learner.forward import share_prompts
from tempering.learner.packing import plan_shared_micro_batches
from tempering.learner.plan import (Layout, MicroBatch, PlanChoices, choose_layout, computed_batch, layout_of,
                                    plan_update)
from tempering.learner.step import collate

PLAIN = dict(skip_zero_advantage=False, merge_duplicates=False, share_prompts=False, packing=False,
             token_budget=0, micro_batch_size=8, chunk=0)


def _choices(**changes) -> PlanChoices:
    return PlanChoices(**{**PLAIN, **changes})


def _batch(rows, advantages):
    """``rows``: (prompt, completion) token lists; old log-probs depend only on the tokens, as
    the sampler records them for identical samples; one advantage per row on its completion."""
    batch = collate([_rollout(prompt, completion, [-0.1 * token for token in completion])
                     for prompt, completion in rows], PAD)
    batch.advantages_BT = torch.tensor(advantages, dtype=torch.float32)[:, None] * batch.loss_mask_BT
    return batch


# rows 0, 1 and 3 are the same sample; row 2 has no signal
SAMPLES = [([5, 6], [7, 8]), ([5, 6], [7, 8]), ([5, 6], [9]), ([5, 6], [7, 8]), ([5, 6], [10, 11, 3])]
ADVANTAGES = [1.0, 1.0, 0.0, 1.0, -1.0]


def test_rows_without_signal_are_left_out_and_identical_rows_computed_once_with_their_count():
    plan = plan_update(_batch(SAMPLES, ADVANTAGES), _choices(skip_zero_advantage=True, merge_duplicates=True))
    assert plan.rows == [0, 4]
    assert plan.counts == [3, 1]
    assert plan.source == [0, 0, -1, 0, 1], "copies take their first row's values; skipped rows none"
    assert (plan.skipped, plan.merged) == (1, 2)
    assert plan.micro_batches == [MicroBatch([0, 1], Layout.PADDED, 0)]


def test_without_skip_or_merge_every_row_is_computed_as_it_is():
    plan = plan_update(_batch(SAMPLES, ADVANTAGES), _choices(micro_batch_size=2, chunk=16))
    assert plan.rows == [0, 1, 2, 3, 4] and plan.counts is None
    assert plan.source == [0, 1, 2, 3, 4] and (plan.skipped, plan.merged) == (0, 0)
    assert [part.rows for part in plan.micro_batches] == [[0, 1], [2, 3], [4]]
    assert {part.chunk for part in plan.micro_batches} == {16}


def test_a_batch_without_signal_keeps_one_row_so_the_update_still_runs():
    plan = plan_update(_batch(SAMPLES, [0.0] * 5), _choices(skip_zero_advantage=True))
    assert plan.rows == [0] and plan.skipped == 4


def test_rows_that_differ_in_what_the_loss_reads_are_not_merged():
    batch = _batch(SAMPLES, ADVANTAGES)
    batch.prox_logprobs_BT = batch.old_logprobs_BT.clone()
    batch.prox_logprobs_BT[1, 3] += 1e-6
    batch.weights_B = torch.tensor([1.0, 1.0, 1.0, 2.0, 1.0])
    plan = plan_update(batch, _choices(merge_duplicates=True))
    assert plan.rows == [0, 1, 2, 3, 4] and plan.counts is None and plan.merged == 0


def test_the_computed_batch_weighs_merged_rows_by_their_count_times_their_weight():
    batch = _batch(SAMPLES, ADVANTAGES)
    batch.weights_B = torch.tensor([0.5, 0.5, 1.0, 0.5, 2.0])
    plan = plan_update(batch, _choices(merge_duplicates=True))
    computed = computed_batch(batch, plan)
    assert plan.rows == [0, 2, 4]
    assert computed.weights_B.tolist() == [1.5, 1.0, 2.0]
    assert torch.equal(computed.input_ids_BT, batch.input_ids_BT[[0, 2, 4]])


def test_the_shared_layout_is_chosen_only_when_it_computes_fewer_tokens():
    long_prompt = [3, 4, 5, 6, 7, 8]
    shared = _batch([(long_prompt, [9, 10]), (long_prompt, [11]), (long_prompt, [9, 9])], [1.0, 1.0, 1.0])
    layout = share_prompts(shared.input_ids_BT, shared.attention_mask_BT, shared.prompt_lengths_B)
    assert layout.tokens < shared.input_ids_BT.numel()  # 6 + 3 * 2 = 12 < 3 * 8 = 24
    assert plan_update(shared, _choices(share_prompts=True)).micro_batches[0].layout is Layout.SHARED
    assert plan_update(shared, _choices()).micro_batches[0].layout is Layout.PADDED, "the model cannot share"
    # a long prompt with one short completion and a short repeated one with long completions:
    # prompts padded to the longest, completions too, cost more than the padded rows
    mixed = _batch([([3], [4] * 8), ([3], [5] * 8), ([6] * 8, [7])], [1.0, 1.0, 1.0])
    layout = share_prompts(mixed.input_ids_BT, mixed.attention_mask_BT, mixed.prompt_lengths_B)
    assert layout.tokens >= mixed.input_ids_BT.numel()  # 2 * 8 + 3 * 8 = 40 >= 3 * 9 = 27
    assert plan_update(mixed, _choices(share_prompts=True)).micro_batches[0].layout is Layout.PADDED
    assert plan_update(mixed, _choices(share_prompts=True, packing=True)).micro_batches[0].layout is Layout.PACKED


def test_a_row_without_a_completion_or_without_a_repeated_prompt_is_never_shared():
    assert choose_layout([3, 4], 4, False, [0, 0], [3, 3]) is Layout.PADDED, "row 0 has no completion"
    assert choose_layout([3, 4], 4, False, [0, 1], [1, 1]) is Layout.PADDED, "no prompt repeated"
    assert choose_layout([3], 3, False, [0], [1]) is Layout.PADDED, "one row"


def test_a_token_budget_with_prompts_to_share_keeps_each_prompts_rows_together():
    samples = [([3, 4, 5], [6, 7]), ([8, 9], [10, 11, 6]), ([3, 4, 5], [7]), ([8, 9], [6]), ([3, 4, 5], [6, 6])]
    batch = _batch(samples, [1.0] * 5)
    plan = plan_update(batch, _choices(share_prompts=True, token_budget=12))
    lengths = batch.attention_mask_BT.sum(1).tolist()
    assert [part.rows for part in plan.micro_batches] == plan_shared_micro_batches(
        [0, 1, 0, 1, 0], [3, 2, 3, 2, 3], lengths, 12)
    assert [part.rows for part in plan.micro_batches] == [[1, 3], [0, 4, 2]]
    assert [part.layout for part in plan.micro_batches] == [Layout.SHARED, Layout.SHARED]
    # without sharing, the budget cuts padded rows from the longest down
    plain = plan_update(batch, _choices(token_budget=12))
    assert [part.rows for part in plain.micro_batches] == [[0, 1], [4, 2], [3]]


def test_callers_without_a_plan_get_the_same_choice_for_their_rows():
    batch = _batch(SAMPLES, ADVANTAGES)
    assert layout_of(batch.input_ids_BT, batch.attention_mask_BT, packing=True) is Layout.PACKED
    assert layout_of(batch.input_ids_BT, batch.attention_mask_BT, packing=False) is Layout.PADDED
    assert layout_of(batch.input_ids_BT, batch.attention_mask_BT, False, batch.prompt_lengths_B) is Layout.SHARED
