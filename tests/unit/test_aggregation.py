"""The loss aggregations, on hand-made token losses with masks of unequal length."""

import pytest
import torch

from tempering.algorithms import AGGREGATIONS
from tempering.algorithms.losses import seq_mean_token_mean, seq_mean_token_sum, token_mean, token_sum_norm

LOSS_BT = torch.tensor([[1.0, 2.0, 3.0],
                        [4.0, 5.0, 6.0],
                        [7.0, 8.0, 9.0]])
MASK_BT = torch.tensor([[1.0, 1.0, 0.0],
                        [1.0, 0.0, 0.0],
                        [0.0, 0.0, 0.0]])


def test_token_mean_divides_the_masked_sum_by_the_whole_batchs_token_count():
    # masked sum 1 + 2 + 4 = 7 over this batch's 3 tokens
    assert token_mean(LOSS_BT, MASK_BT, 3, 3).item() == pytest.approx(7 / 3, abs=1e-6)
    # a micro-batch of a larger batch of 6 tokens contributes its share only
    assert token_mean(LOSS_BT, MASK_BT, 6, 3).item() == pytest.approx(7 / 6, abs=1e-6)


def test_seq_mean_token_mean_weighs_sequences_equally():
    # row means (1 + 2) / 2 = 1.5 and 4 / 1 = 4; the all-masked row contributes 0 but counts
    assert seq_mean_token_mean(LOSS_BT, MASK_BT, 3, 3).item() == pytest.approx((1.5 + 4.0) / 3, abs=1e-6)
    # as a micro-batch of a batch of 5 sequences
    assert seq_mean_token_mean(LOSS_BT, MASK_BT, 3, 5).item() == pytest.approx(5.5 / 5, abs=1e-6)


def test_seq_mean_token_sum_sums_each_sequence_then_averages_sequences():
    # row sums 1 + 2 = 3, 4, 0 (all masked); (3 + 4 + 0) / 3 sequences
    assert seq_mean_token_sum(LOSS_BT, MASK_BT, 3, 3).item() == pytest.approx(7 / 3, abs=1e-6)
    # as a micro-batch of a batch of 5 sequences: 7 / 5; the token count plays no part
    assert seq_mean_token_sum(LOSS_BT, MASK_BT, 99, 5).item() == pytest.approx(7 / 5, abs=1e-6)


def test_token_sum_norm_divides_by_a_constant_length_per_sequence():
    # masked sum 7 over 3 sequences * 4 tokens = 12
    assert token_sum_norm(LOSS_BT, MASK_BT, 3, 3, 4).item() == pytest.approx(7 / 12, abs=1e-6)
    # the token count does not matter; the same sum over 5 sequences of norm 10: 7 / 50
    assert token_sum_norm(LOSS_BT, MASK_BT, 99, 5, 10).item() == pytest.approx(7 / 50, abs=1e-6)


def test_token_sum_norm_weighs_a_token_the_same_however_long_its_sequence():
    # gradient of every trained token: 1 / (3 * 4), whether its row has 2 trained tokens or 1
    loss_BT = LOSS_BT.clone().requires_grad_()
    token_sum_norm(loss_BT, MASK_BT, 3, 3, 4).backward()
    torch.testing.assert_close(loss_BT.grad, MASK_BT / 12, atol=1e-7, rtol=0)


@pytest.mark.parametrize("name", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "token_sum_norm"])
def test_micro_batches_add_up_to_the_full_batch(name):
    aggregate = AGGREGATIONS[name]
    full = aggregate(LOSS_BT, MASK_BT, 3, 3, 4)
    parts = sum(aggregate(LOSS_BT[rows], MASK_BT[rows], 3, 3, 4) for rows in (slice(0, 1), slice(1, 3)))
    assert parts.item() == pytest.approx(full.item(), abs=1e-6)
