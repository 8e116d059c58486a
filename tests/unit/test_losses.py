"""The policy losses, on inputs whose results are worked out by hand."""

import math

import pytest
import torch

from tempering.algorithms import AGGREGATIONS, LOSSES, LossInputs, losses
from tempering.algorithms.losses import (
    cispo,
    dual_clip,
    gspo,
    ppo_clip,
    reinforce,
    seq_mean_token_mean,
    token_mean,
)


def _inputs(ratios_BT, advantages_BT, mask_BT, clip_low=0.2, clip_high=0.2, dual=3.0) -> LossInputs:
    """Old log-probs of -1 and current ones chosen so that exp(logp - old) is the given ratio."""
    old_BT = torch.full((len(ratios_BT), len(ratios_BT[0])), -1.0)
    logprobs_BT = (old_BT + torch.tensor(ratios_BT, dtype=torch.float64).log().float()).requires_grad_()
    return LossInputs(logprobs_BT=logprobs_BT, old_logprobs_BT=old_BT,
                      advantages_BT=torch.tensor(advantages_BT), mask_BT=torch.tensor(mask_BT),
                      clip_low=clip_low, clip_high=clip_high, dual_clip=dual)


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


def test_dual_clip_caps_the_loss_of_negative_advantages_at_minus_a_times_c():
    inputs = _inputs(
        ratios_BT=[[4.0, 2.0, 4.0],
                   [0.5, 1.0, 5.0]],
        advantages_BT=[[-1.0, -1.0, 1.0],
                       [-2.0, -0.5, -1.0]],
        mask_BT=[[1.0, 1.0, 1.0],
                 [1.0, 1.0, 0.0]],
    )

    loss_BT, metrics = dual_clip(inputs)

    # ppo = max(-A * r, -A * clip(r, 0.8, 1.2)); for A < 0 the result is min(ppo, -A * 3)
    # r=4   A=-1: ppo max(4, 1.2) = 4, cap 3     -> 3    (dual clip holds: gradient 0)
    # r=2   A=-1: ppo max(2, 1.2) = 2, cap 3     -> 2    (gradient -A * r = 2)
    # r=4   A=1:  ppo max(-4, -1.2) = -1.2        -> -1.2 (positive advantage: plain PPO clip)
    # r=0.5 A=-2: ppo max(1, 1.6) = 1.6, cap 6   -> 1.6  (clipped below: gradient 0)
    # r=1   A=-0.5: ppo 0.5, cap 1.5              -> 0.5  (gradient 0.5)
    # r=5   A=-1: ppo 5, cap 3                    -> 3    (masked out of the metrics)
    expected_BT = torch.tensor([[3.0, 2.0, -1.2],
                                [1.6, 0.5, 3.0]])
    torch.testing.assert_close(loss_BT.detach(), expected_BT, atol=1e-6, rtol=0)
    loss_BT.sum().backward()
    torch.testing.assert_close(inputs.logprobs_BT.grad, torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.5, 0.0]]),
                               atol=1e-6, rtol=0)
    # of 5 trained tokens: dual clip holds on 1 (r=4, A=-1); PPO's clip on 2 (r=4 A=1, r=0.5 A=-2)
    assert metrics["dual_clip_fraction"] == pytest.approx(1 / 5, abs=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(2 / 5, abs=1e-6)


def test_gspo_clips_one_geometric_mean_ratio_per_sequence():
    log_ratio_BT = torch.tensor([[0.1, -0.2, 0.4, 5.0],
                                 [0.5, 0.3, 9.0, 9.0],
                                 [-0.3, -0.3, -0.3, -0.3]])
    mask_BT = torch.tensor([[1.0, 1.0, 1.0, 0.0],
                            [1.0, 1.0, 0.0, 0.0],
                            [1.0, 1.0, 1.0, 1.0]])
    old_BT = torch.full((3, 4), -2.0)
    logprobs_BT = (old_BT + log_ratio_BT).requires_grad_()
    advantages_BT = torch.tensor([[1.0], [2.0], [-1.0]]) * torch.ones(3, 4)
    inputs = LossInputs(logprobs_BT=logprobs_BT, old_logprobs_BT=old_BT, advantages_BT=advantages_BT,
                        mask_BT=mask_BT)

    loss_BT, metrics = gspo(inputs)

    # row 0: mean log-ratio over trained tokens (0.1 - 0.2 + 0.4) / 3 = 0.1, s = e^0.1 = 1.10517092,
    #        inside [0.8, 1.2]: loss -1 * 1.10517092 on every token; gradient -A * s per token
    # row 1: (0.5 + 0.3) / 2 = 0.4, s = e^0.4 = 1.49182470 > 1.2 with A = 2: loss -2 * 1.2 = -2.4, gradient 0
    # row 2: s = e^-0.3 = 0.74081822 < 0.8 with A = -1: loss max(0.74081822, 0.8) = 0.8, gradient 0
    s0 = 1.1051709180756477
    expected_BT = torch.tensor([[-s0] * 4, [-2.4] * 4, [0.8] * 4])
    torch.testing.assert_close(loss_BT.detach(), expected_BT, atol=1e-6, rtol=0)
    (loss_BT * mask_BT).sum().backward()
    # each trained token of row 0: -A * s0 = -s0 (its own term; the sequence ratio's value is held)
    torch.testing.assert_close(logprobs_BT.grad, torch.tensor([[-s0, -s0, -s0, 0.0], [0.0] * 4, [0.0] * 4]),
                               atol=1e-6, rtol=0)
    # clipped tokens: 2 of row 1 and 4 of row 2, of 9 trained tokens
    assert metrics["clip_fraction"] == pytest.approx(6 / 9, abs=1e-6)
    assert metrics["ratio_mean"] == pytest.approx((3 * s0 + 2 * 1.4918246976412703 + 4 * 0.7408182206817179) / 9,
                                                  abs=1e-6)


def test_cispo_keeps_a_gradient_on_clipped_tokens_weighted_by_the_clipped_ratio():
    inputs = _inputs(
        ratios_BT=[[1.5, 0.5, 1.1, 2.0]],
        advantages_BT=[[1.0, -1.0, 2.0, -1.0]],
        mask_BT=[[1.0, 1.0, 1.0, 1.0]],
        clip_low=0.2, clip_high=0.3,
    )

    loss_BT, metrics = cispo(inputs)

    # weight clip(r, 0.8, 1.3): 1.3, 0.8, 1.1, 1.3; value and gradient -A * weight:
    # -1.3, 0.8, -2.2, 1.3 (PPO would give the first, second and fourth tokens no gradient)
    expected_BT = torch.tensor([[-1.3, 0.8, -2.2, 1.3]])
    torch.testing.assert_close(loss_BT.detach(), expected_BT, atol=1e-6, rtol=0)
    loss_BT.sum().backward()
    torch.testing.assert_close(inputs.logprobs_BT.grad, expected_BT, atol=1e-6, rtol=0)
    assert metrics["clip_fraction"] == pytest.approx(3 / 4, abs=1e-6)


def test_reinforce_is_minus_advantage_times_logprob():
    logprobs_BT = torch.tensor([[-0.5, -2.0]], requires_grad=True)
    inputs = LossInputs(logprobs_BT=logprobs_BT, old_logprobs_BT=torch.tensor([[-0.5, -1.0]]),
                        advantages_BT=torch.tensor([[1.0, -0.5]]), mask_BT=torch.ones(1, 2))

    loss_BT, metrics = reinforce(inputs)

    # -1 * -0.5 = 0.5 and 0.5 * -2 = -1; gradient -A = -1, 0.5; no importance ratio
    torch.testing.assert_close(loss_BT.detach(), torch.tensor([[0.5, -1.0]]), atol=1e-6, rtol=0)
    loss_BT.sum().backward()
    torch.testing.assert_close(logprobs_BT.grad, torch.tensor([[-1.0, 0.5]]), atol=1e-6, rtol=0)
    # ratios exp(0) = 1 and exp(-1) = 0.36787944, reported only
    assert metrics["ratio_mean"] == pytest.approx((1 + 0.36787944117144233) / 2, abs=1e-6)


@pytest.mark.parametrize("name", ["ppo_clip", "dual_clip", "gspo", "cispo", "reinforce"])
def test_every_loss_at_the_sampling_policy_has_the_policy_gradient_minus_a(name):
    # ratio 1 everywhere: each loss's gradient is -A per token (GSPO's too: each token's ratio has the
    # value of its row's s = 1 and the gradient s in its own log-prob)
    inputs = _inputs(ratios_BT=[[1.0, 1.0, 1.0]], advantages_BT=[[0.5, 0.5, 0.5]], mask_BT=[[1.0, 1.0, 1.0]])
    loss_BT, _ = LOSSES[name](inputs)
    loss_BT.sum().backward()
    torch.testing.assert_close(inputs.logprobs_BT.grad, torch.tensor([[-0.5, -0.5, -0.5]]), atol=1e-6, rtol=0)


def test_registries_name_the_losses_and_aggregations():
    assert LOSSES["ppo_clip"] is ppo_clip
    assert {"dual_clip", "gspo", "cispo", "reinforce"} <= set(LOSSES)
    assert AGGREGATIONS["token_mean"] is token_mean
    assert AGGREGATIONS["seq_mean_token_mean"] is seq_mean_token_mean


@pytest.mark.parametrize("name", ["ppo_clip", "dual_clip", "gspo", "cispo", "reinforce"])
@pytest.mark.parametrize("log_ratio", [100.0, -110.0])
def test_every_loss_stays_finite_at_log_ratios_past_the_float32_range_of_exp(name, log_ratio):
    # exp(100) is inf and exp(-110) is 0 in float32: unclamped, these finite inputs gave NaN losses
    # (-0 * inf) or NaN gradients (0 * inf through exp, or CISPO's clip(r) / r with r = 0)
    old_BT = torch.full((1, 3), -120.0)
    logprobs_BT = (old_BT + log_ratio).requires_grad_()
    inputs = LossInputs(logprobs_BT=logprobs_BT, old_logprobs_BT=old_BT,
                        advantages_BT=torch.tensor([[1.0, -1.0, 0.0]]), mask_BT=torch.ones(1, 3))
    loss_BT, metrics = LOSSES[name](inputs)
    loss_BT.sum().backward()
    assert torch.isfinite(loss_BT).all(), loss_BT
    assert torch.isfinite(logprobs_BT.grad).all(), logprobs_BT.grad
    assert all(math.isfinite(value) for value in metrics.values()), metrics


def test_the_importance_ratio_is_exp_of_the_log_ratio_clamped_to_plus_minus_20():
    # log-ratios 30 and -30 become 20 and -20: ratios e^20 = 485165195.4 and e^-20 = 2.0611536e-9;
    # outside the clamp the ratio no longer moves with logp, so its gradient is 0 there
    old_BT = torch.zeros(1, 3)
    logprobs_BT = torch.tensor([[30.0, -30.0, 0.5]], requires_grad=True)
    inputs = LossInputs(logprobs_BT=logprobs_BT, old_logprobs_BT=old_BT,
                        advantages_BT=torch.tensor([[-1.0, -1.0, -1.0]]), mask_BT=torch.ones(1, 3))
    loss_BT, _ = ppo_clip(inputs)
    # A = -1: max(r, clip(r, 0.8, 1.2)) = e^20, 0.8 (clipped below), e^0.5 = 1.6487213 (not clipped)
    expected_BT = torch.tensor([[math.exp(20.0), 0.8, math.exp(0.5)]])
    torch.testing.assert_close(loss_BT.detach(), expected_BT, rtol=1e-6, atol=1e-6)
    loss_BT.sum().backward()
    torch.testing.assert_close(logprobs_BT.grad, torch.tensor([[0.0, 0.0, math.exp(0.5)]]), atol=1e-6, rtol=0)
    assert losses.LOG_RATIO_LIMIT == 20.0


def test_cispo_far_below_the_sampler_keeps_the_clipped_weight_as_its_gradient():
    # log-ratio -110 (r = 0 in float32): value and gradient -A * clip(r, 0.8, 1.2) = -0.8 for A = 1;
    # written as clip(r) / r * r this was 0.8 / 0 * 0: NaN
    old_BT = torch.zeros(1, 1)
    logprobs_BT = torch.full((1, 1), -110.0, requires_grad=True)
    inputs = LossInputs(logprobs_BT=logprobs_BT, old_logprobs_BT=old_BT, advantages_BT=torch.ones(1, 1),
                        mask_BT=torch.ones(1, 1))
    loss_BT, _ = cispo(inputs)
    loss_BT.sum().backward()
    torch.testing.assert_close(loss_BT.detach(), torch.tensor([[-0.8]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(logprobs_BT.grad, torch.tensor([[-0.8]]), atol=1e-6, rtol=0)


def test_gspo_token_clips_each_token_with_its_own_advantage_against_the_sequence_ratio():
    # GSPO-token: log s_t = sg(log s) + logp_t - sg(logp_t), so every token's ratio has the value of its
    # row's s and the gradient s in its own logp only; each token keeps its advantage and its clip decision.
    # row 0: log-ratios 0.5 on 3 trained tokens, s = e^0.5 = 1.6487213 > 1.2; advantages 2, -1, 2:
    #        A=2:  max(-2 s, -2 * 1.2) = -2.4, clipped (no gradient)
    #        A=-1: max(s, 1.2) = s, unclipped: gradient -A * s = s on that token alone
    #        (the row's mean advantage 1 would have clipped all three and given no gradient)
    # row 1: log-ratios 0.1, -0.2, 0.4, s = e^0.1 = 1.1051709 inside [0.8, 1.2]; advantages 1, -2, 0.5:
    #        losses -s, 2 s, -0.5 s and gradients the same (-A * s per token)
    old_BT = torch.zeros(2, 4)
    logprobs_BT = torch.tensor([[0.5, 0.5, 0.5, 7.0],
                                [0.1, -0.2, 0.4, -3.0]], requires_grad=True)
    inputs = LossInputs(logprobs_BT=logprobs_BT, old_logprobs_BT=old_BT,
                        advantages_BT=torch.tensor([[2.0, -1.0, 2.0, 0.0],
                                                    [1.0, -2.0, 0.5, 0.0]]),
                        mask_BT=torch.tensor([[1.0, 1.0, 1.0, 0.0],
                                              [1.0, 1.0, 1.0, 0.0]]))
    loss_BT, metrics = gspo(inputs)
    (loss_BT * inputs.mask_BT).sum().backward()
    s0, s1 = math.exp(0.5), math.exp(0.1)
    torch.testing.assert_close(loss_BT.detach(), torch.tensor([[-2.4, s0, -2.4, 0.0],
                                                               [-s1, 2 * s1, -0.5 * s1, 0.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(logprobs_BT.grad, torch.tensor([[0.0, s0, 0.0, 0.0],
                                                               [-s1, 2 * s1, -0.5 * s1, 0.0]]), atol=1e-6, rtol=0)
    assert metrics["clip_fraction"] == pytest.approx(2 / 6, abs=1e-6)
    assert metrics["ratio_mean"] == pytest.approx((s0 + s1) / 2, abs=1e-6)


def _random_rows(advantages: str, seed: int = 0) -> LossInputs:
    """Six rows of different lengths in float64, each row's log-ratios its own offset plus noise in
    [-0.2, 0.2] (sequence ratios inside and outside the clip range [0.9, 1.15], on either side),
    advantages one per row or one per token, garbage off the mask."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 1, 4, 6, 3, 5])
    mask_BT = (torch.arange(7)[None, :] < lengths[:, None]).double()
    offset_B1 = torch.tensor([[0.3], [-0.05], [-0.25], [0.02], [0.2], [-0.15]], dtype=torch.float64)
    old_BT = -3 * torch.rand(6, 7, generator=gen, dtype=torch.float64)
    logprobs_BT = old_BT + offset_B1 + 0.4 * torch.rand(6, 7, generator=gen, dtype=torch.float64) - 0.2
    logprobs_BT = torch.where(mask_BT > 0, logprobs_BT, torch.full_like(logprobs_BT, 9.0)).requires_grad_()
    shape = (6, 1) if advantages == "sequence" else (6, 7)
    advantages_BT = torch.randn(shape, generator=gen, dtype=torch.float64).expand(6, 7)
    return LossInputs(logprobs_BT=logprobs_BT, old_logprobs_BT=old_BT, advantages_BT=advantages_BT,
                      mask_BT=mask_BT, clip_low=0.1, clip_high=0.15)


def _reference_gspo_token(x: LossInputs) -> torch.Tensor:
    """verl's GSPO-token written out row by row: the sequence log-ratio is the masked mean of the
    token log-ratios, detached; token t's ratio is exp(that + logp_t - sg(logp_t)); per token
    max(-A_t * r_t, -A_t * clip(r_t, 1 - low, 1 + high))."""
    rows = []
    for logp_T, old_T, adv_T, mask_T in zip(x.logprobs_BT, x.old_logprobs_BT, x.advantages_BT, x.mask_BT):
        trained = mask_T.bool()
        log_s = (logp_T[trained] - old_T[trained]).mean().detach()
        ratio_T = torch.exp(log_s + logp_T - logp_T.detach())
        clipped_T = torch.clamp(ratio_T, 1 - x.clip_low, 1 + x.clip_high)
        rows.append(torch.maximum(-adv_T * ratio_T, -adv_T * clipped_T))
    return torch.stack(rows)


def _reference_gspo_sequence(x: LossInputs) -> torch.Tensor:
    """GSPO as the paper writes it for one advantage per sequence: s = exp(mean log-ratio), with its
    gradient through every token of the row, and max(-A * s, -A * clip(s)) on each of its tokens."""
    log_s_B = ((x.logprobs_BT - x.old_logprobs_BT) * x.mask_BT).sum(-1) / x.mask_BT.sum(-1)
    s_B = torch.exp(log_s_B)
    advantage_B = x.advantages_BT[:, 0]
    loss_B = torch.maximum(-advantage_B * s_B, -advantage_B * s_B.clamp(1 - x.clip_low, 1 + x.clip_high))
    return loss_B[:, None].expand_as(x.mask_BT)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "token_sum_norm"])
@pytest.mark.parametrize("advantages, reference", [("token", _reference_gspo_token),
                                                   ("sequence", _reference_gspo_token),
                                                   ("sequence", _reference_gspo_sequence)])
def test_gspo_equals_gspo_token_and_on_sequence_advantages_the_sequence_level_form(aggregation, advantages,
                                                                                  reference):
    # value and gradient of the aggregated loss to 1e-6: against verl's GSPO-token formula (token or
    # sequence advantages), and, with one advantage per row, against the sequence-level form GSPO had
    # before (the two have the same value, and the same gradient whenever a row's tokens weigh alike)
    aggregate = AGGREGATIONS[aggregation]
    ours = _random_rows(advantages)
    theirs = _random_rows(advantages)
    tokens, sequences = int(ours.mask_BT.sum()), len(ours.mask_BT)
    loss_BT, _ = gspo(ours)
    loss = aggregate(loss_BT, ours.mask_BT, tokens, sequences, 8)
    expected = aggregate(reference(theirs), theirs.mask_BT, tokens, sequences, 8)
    loss.backward()
    expected.backward()
    with torch.no_grad():
        log_ratio_BT = (theirs.logprobs_BT - theirs.old_logprobs_BT) * theirs.mask_BT
        s_B = torch.exp(log_ratio_BT.sum(-1) / theirs.mask_BT.sum(-1))
    assert (s_B > 1.15).any() and (s_B < 0.9).any() and ((s_B > 0.9) & (s_B < 1.15)).any(), s_B
    assert abs(loss.item() - expected.item()) < 1e-6
    torch.testing.assert_close(ours.logprobs_BT.grad, theirs.logprobs_BT.grad, atol=1e-6, rtol=0)
