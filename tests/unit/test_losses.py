"""The PPO-clip loss and the loss aggregations, on inputs whose results are worked out by hand."""

import pytest
import torch

from tempering.algorithms import AGGREGATIONS, LOSSES, LossInputs
from tempering.algorithms.losses import ppo_clip, seq_mean_token_mean, token_mean


def _inputs(ratios_BT, advantages_BT, mask_BT, clip_low=0.2, clip_high=0.2) -> LossInputs:
    """Old log-probs of -1 and current ones chosen so that exp(logp - old) is the given ratio."""
    old_BT = torch.full((len(ratios_BT), len(ratios_BT[0])), -1.0)
    logprobs_BT = (old_BT + torch.tensor(ratios_BT, dtype=torch.float64).log().float()).requires_grad_()
    return LossInputs(logprobs_BT=logprobs_BT, old_logprobs_BT=old_BT,
                      advantages_BT=torch.tensor(advantages_BT), mask_BT=torch.tensor(mask_BT),
                      clip_low=clip_low, clip_high=clip_high)


def test_ppo_clip_golden_values_gradients_and_metrics():
    inputs = _inputs(
        ratios_BT=[[1.1, 1.5, 1.5, 0.5],
                   [0.5, 0.5, 1.0, 0.75]],
        advantages_BT=[[2.0, 1.0, -1.0, -1.0],
                       [-1.0, 1.0, 0.0, -2.0]],
        mask_BT=[[1.0, 1.0, 1.0, 0.0],
                 [1.0, 1.0, 1.0, 1.0]],
    )

    loss_BT, metrics = ppo_clip(inputs)

    # per token: max(-A * r, -A * clip(r, 0.8, 1.2))
    # r=1.1 A=2:  max(-2.2, -2.2)  = -2.2  inside the range
    # r=1.5 A=1:  max(-1.5, -1.2)  = -1.2  clipped above (positive advantage)
    # r=1.5 A=-1: max(1.5, 1.2)    = 1.5   not clipped: a worse ratio is never forgiven
    # r=0.5 A=-1: max(0.5, 0.8)    = 0.8   clipped below (masked out: not in the metrics)
    # r=0.5 A=-1: max(0.5, 0.8)    = 0.8   clipped below (negative advantage)
    # r=0.5 A=1:  max(-0.5, -0.8)  = -0.5  not clipped
    # r=1.0 A=0:  0
    # r=0.75 A=-2: max(1.5, 1.6)   = 1.6   clipped below
    expected_BT = torch.tensor([[-2.2, -1.2, 1.5, 0.8],
                                [0.8, -0.5, 0.0, 1.6]])
    torch.testing.assert_close(loss_BT.detach(), expected_BT, atol=1e-6, rtol=0)

    # d loss / d logp = -A * r where the unclipped term is active, 0 where the clip holds.
    loss_BT.sum().backward()
    expected_grad_BT = torch.tensor([[-2.2, 0.0, 1.5, 0.0],
                                     [0.0, -0.5, 0.0, 0.0]])
    torch.testing.assert_close(inputs.logprobs_BT.grad, expected_grad_BT, atol=1e-6, rtol=0)

    # 7 masked-in tokens, of which 3 are clipped (1.5/A=1, 0.5/A=-1, 0.75/A=-2);
    # ratio mean (1.1 + 1.5 + 1.5 + 0.5 + 0.5 + 1.0 + 0.75) / 7 = 6.85 / 7.
    assert metrics["clip_fraction"] == pytest.approx(3 / 7, abs=1e-6)
    assert metrics["ratio_mean"] == pytest.approx(6.85 / 7, abs=1e-6)


def test_ppo_clip_with_asymmetric_range_clips_at_one_minus_low_and_one_plus_high():
    inputs = _inputs(
        ratios_BT=[[1.25, 1.5, 0.85, 0.95]],
        advantages_BT=[[1.0, 1.0, -1.0, -1.0]],
        mask_BT=[[1.0, 1.0, 1.0, 1.0]],
        clip_low=0.1, clip_high=0.3,
    )

    loss_BT, metrics = ppo_clip(inputs)

    # range [0.9, 1.3]
    # r=1.25 A=1:  -1.25 inside (a symmetric 0.2 range would clip it to -1.2)
    # r=1.5  A=1:  max(-1.5, -1.3) = -1.3
    # r=0.85 A=-1: max(0.85, 0.9)  = 0.9
    # r=0.95 A=-1: 0.95 inside
    expected_BT = torch.tensor([[-1.25, -1.3, 0.9, 0.95]])
    torch.testing.assert_close(loss_BT.detach(), expected_BT, atol=1e-6, rtol=0)
    assert metrics["clip_fraction"] == pytest.approx(2 / 4, abs=1e-6)


def test_ppo_clip_at_the_sampling_policy_is_minus_the_advantage():
    # ratio 1 everywhere: the loss is -A and its gradient -A (the policy-gradient estimator).
    inputs = _inputs(ratios_BT=[[1.0, 1.0, 1.0]], advantages_BT=[[0.5, -2.0, 3.0]], mask_BT=[[1.0, 1.0, 1.0]])
    loss_BT, metrics = ppo_clip(inputs)
    loss_BT.sum().backward()
    torch.testing.assert_close(loss_BT.detach(), torch.tensor([[-0.5, 2.0, -3.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(inputs.logprobs_BT.grad, torch.tensor([[-0.5, 2.0, -3.0]]), atol=1e-6, rtol=0)
    assert metrics["clip_fraction"] == 0.0


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


def test_aggregations_of_micro_batches_add_up_to_the_full_batch():
    for name in ("token_mean", "seq_mean_token_mean"):
        aggregate = AGGREGATIONS[name]
        full = aggregate(LOSS_BT, MASK_BT, 3, 3)
        parts = sum(aggregate(LOSS_BT[rows], MASK_BT[rows], 3, 3) for rows in (slice(0, 1), slice(1, 3)))
        assert parts.item() == pytest.approx(full.item(), abs=1e-6), name


def test_registries_name_the_loss_and_aggregations():
    assert LOSSES["ppo_clip"] is ppo_clip
    assert AGGREGATIONS["token_mean"] is token_mean
    assert AGGREGATIONS["seq_mean_token_mean"] is seq_mean_token_mean
