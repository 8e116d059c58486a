"""The RL objective on hand-computed inputs: every term, its metric and its gradient, to 1e-6."""

import math

import pytest
import torch

from tempering.algorithms import AGGREGATIONS, LOSSES
from tempering.algorithms.objective import ObjectiveInputs, ObjectiveSettings, objective


def _settings(**fields) -> ObjectiveSettings:
    return ObjectiveSettings(**{
        "loss": LOSSES["ppo_clip"], "aggregation": AGGREGATIONS["token_mean"], "clip_low": 0.2, "clip_high": 0.2,
        "dual_clip": 3.0, "norm_length": 1, "entropy_coef": 0.0, "kl_estimator": "k1", "kl_clamp": 0.0,
        "value_coef": 0.5, "value_clip": 0.2, "off_policy": "none", "is_cap": 2.0, "mismatch_correction": "none",
        "mismatch_low": 0.8, "mismatch_high": 1.25, "dpo_beta": 0.1, **fields})


def _inputs(**fields) -> ObjectiveInputs:
    """Two trained tokens of one row (and a third off the mask), as part of a 4-token batch."""
    return ObjectiveInputs(**{
        "logprobs_BT": torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True),
        "sampler_logprobs_BT": torch.tensor([[-1.0, -2.5, -0.5]]),
        "advantages_BT": torch.tensor([[1.0, -1.0, 5.0]]), "mask_BT": torch.tensor([[1.0, 1.0, 0.0]]),
        "entropy_BT": torch.tensor([[0.5, 1.0, 9.0]], requires_grad=True), "batch_tokens": 4, "batch_sequences": 2,
        **fields})


def test_every_term_of_the_objective_on_hand_computed_values():
    x = _inputs(weights_B=torch.tensor([2.0]), ref_logprobs_BT=torch.tensor([[-1.5, -2.0, 0.0]]), kl_coef=0.2,
                values_BT=torch.tensor([[0.5, 0.1, 3.0]], requires_grad=True),
                old_values_BT=torch.zeros(1, 3), returns_BT=torch.tensor([[1.0, 1.0, 0.0]]))
    loss, metrics = objective(x, _settings(entropy_coef=0.1))

    # ratios exp(logp - sampler) = 1 and e^0.5; ppo_clip max(-A r, -A clip(r)): -1, and e^0.5 (unclipped is larger)
    # x row weight 2:                      -2,     2 e^0.5
    # - 0.1 x entropy (0.5, 1):           -0.05,  -0.1
    # + 0.2 x k1 = logp - ref (0.5, 0):   +0.1,   +0
    # + 0.5 x value loss: 0.5 max((v-R)^2, (v_clip-R)^2), v_clip = clamp(v, -0.2, 0.2):
    #   0.5 max(0.25, 0.64) = 0.32 -> +0.16;  0.5 x 0.81 = 0.405 -> +0.2025
    # token mean over the batch's 4 tokens: (-1.79 + 2 e^0.5 + 0.1025) / 4
    expected = (-1.79 + 2 * math.exp(0.5) + 0.1025) / 4
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics == pytest.approx({"clip_fraction": 0.0, "ratio_mean": (1 + math.exp(0.5)) / 2, "kl": 0.25,
                                     "value_loss": (0.32 + 0.405) / 2, "loss": expected, "entropy": 0.75}, abs=1e-6)
    loss.backward()
    # d/dlogp: policy -A r x 2 (-2, 2 e^0.5), k1 x 0.2 (+0.2 each); nothing off the mask
    torch.testing.assert_close(x.logprobs_BT.grad, torch.tensor([[-1.8, 2 * math.exp(0.5) + 0.2, 0.0]]) / 4,
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(x.entropy_BT.grad, torch.tensor([[-0.1, -0.1, 0.0]]) / 4, atol=1e-6, rtol=0)
    # the clipped value term wins on token 0 (no gradient); token 1: 0.5 x (v - R) = -0.45
    torch.testing.assert_close(x.values_BT.grad, torch.tensor([[0.0, -0.45, 0.0]]) / 4, atol=1e-6, rtol=0)


@pytest.mark.parametrize("off_policy, weights", [("tis", [1.0, 1.1]), ("decoupled", [1.0, math.exp(0.5)])])
def test_a_proximal_policy_anchors_the_ratio_and_weighs_tokens_by_pi_prox_over_pi_sampler(off_policy, weights):
    x = _inputs(prox_logprobs_BT=torch.tensor([[-1.0, -2.0, -3.0]]))
    loss, metrics = objective(x, _settings(off_policy=off_policy, is_cap=1.1))
    # ratios against the proximal policy are 1: the policy loss is -A = (-1, 1), times the behaviour weight
    # exp(prox - sampler) = (1, e^0.5), which "tis" truncates at 1.1
    assert loss.item() == pytest.approx((-weights[0] + weights[1]) / 4, abs=1e-6)
    assert metrics["behaviour_weight"] == pytest.approx(sum(weights) / 2, abs=1e-6)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)


def test_a_mismatch_correction_takes_the_place_of_the_behaviour_weight():
    x = _inputs(prox_logprobs_BT=torch.tensor([[-1.0, -2.0, -3.0]]))
    loss, metrics = objective(x, _settings(off_policy="tis", mismatch_correction="mis_token"))
    # w = exp(prox - sampler) = (1, e^0.5): the second leaves the band [0.8, 1.25] and weighs 0;
    # the policy loss against the proximal policy is -A = (-1, 1)
    assert loss.item() == pytest.approx(-1 / 4, abs=1e-6)
    assert metrics["mismatch/is_weight"] == pytest.approx(0.5, abs=1e-6) and metrics["mismatch/masked"] == 0.5
    assert "behaviour_weight" not in metrics


def test_without_optional_inputs_only_the_policy_loss_is_aggregated():
    x = _inputs()
    loss, metrics = objective(x, _settings(entropy_coef=0.0))
    assert loss.item() == pytest.approx((-1 + math.exp(0.5)) / 4, abs=1e-6)
    assert set(metrics) == {"clip_fraction", "ratio_mean", "loss", "entropy"}
    loss.backward()
    assert x.entropy_BT.grad is None, "no bonus, no gradient into the entropy"


@pytest.mark.parametrize("loss", ["ppo_clip", "dual_clip", "gspo", "cispo", "reinforce"])
@pytest.mark.parametrize("off_policy", ["tis", "decoupled"])
@pytest.mark.parametrize("log_weight", [100.0, -110.0])
def test_the_behaviour_weight_stays_finite_at_log_ratios_past_the_float32_range_of_exp(loss, off_policy, log_weight):
    # a proximal policy 100 nats above the sampler on three tokens: exp(100) is inf in float32, and
    # unclamped "decoupled" made their losses inf (-inf for A > 0) and NaN at A = 0 (-110 underflows
    # to 0). The log-ratio is clamped to +-LOG_RATIO_LIMIT as the losses clamp theirs: the weights are
    # e^20 or e^-20, and 1 on the fourth token, where prox and sampler agree.
    sampler_BT = torch.tensor([[-105.0, -105.0, -105.0, -1.0]])
    x = _inputs(logprobs_BT=torch.tensor([[-2.0, -1.0, -3.0, -1.0]], requires_grad=True),
                sampler_logprobs_BT=sampler_BT,
                prox_logprobs_BT=sampler_BT + log_weight * torch.tensor([[1.0, 1.0, 1.0, 0.0]]),
                advantages_BT=torch.tensor([[1.0, -1.0, 0.0, 1.0]]), mask_BT=torch.ones(1, 4),
                entropy_BT=torch.zeros(1, 4))
    result, metrics = objective(x, _settings(loss=LOSSES[loss], off_policy=off_policy))
    result.backward()
    assert math.isfinite(result.item()), result
    assert torch.isfinite(x.logprobs_BT.grad).all(), x.logprobs_BT.grad
    assert all(math.isfinite(value) for value in metrics.values()), metrics
    if off_policy == "decoupled":
        expected = math.exp(20.0) if log_weight > 0 else math.exp(-20.0)
        assert metrics["behaviour_weight"] == pytest.approx((3 * expected + 1) / 4, rel=1e-6)
