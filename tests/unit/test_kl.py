"""KL estimators between the policy and the reference, on hand-computed log-probs, and the
fixed and adaptive KL coefficient."""

import math

import pytest
import torch

from tempering.algorithms import kl_estimate
from tempering.algorithms.kl import KLCoefficient

# delta = ref - logp = [-1.5 - (-1.0), -1.0 - (-2.0), -3.0 - (-3.0)] = [-0.5, 1.0, 0.0]
LOGPROBS_BT = torch.tensor([[-1.0, -2.0, -3.0]])
REF_LOGPROBS_BT = torch.tensor([[-1.5, -1.0, -3.0]])


def test_k1_is_minus_the_log_ratio():
    # -delta
    expected = torch.tensor([[0.5, -1.0, 0.0]])
    torch.testing.assert_close(kl_estimate(LOGPROBS_BT, REF_LOGPROBS_BT, "k1"), expected, atol=1e-6, rtol=0)


def test_k2_is_half_the_squared_log_ratio():
    # delta² / 2 = [0.25 / 2, 1 / 2, 0]
    expected = torch.tensor([[0.125, 0.5, 0.0]])
    torch.testing.assert_close(kl_estimate(LOGPROBS_BT, REF_LOGPROBS_BT, "k2"), expected, atol=1e-6, rtol=0)


def test_k3_is_exp_delta_minus_delta_minus_one():
    # exp(-0.5) + 0.5 - 1 = 0.60653066 - 0.5 = 0.10653066;  e - 1 - 1 = 0.71828183;  1 - 0 - 1 = 0
    expected = torch.tensor([[math.exp(-0.5) - 0.5, math.e - 2.0, 0.0]])
    torch.testing.assert_close(kl_estimate(LOGPROBS_BT, REF_LOGPROBS_BT, "k3"), expected, atol=1e-6, rtol=0)


def test_k3_is_the_default_estimator():
    torch.testing.assert_close(kl_estimate(LOGPROBS_BT, REF_LOGPROBS_BT),
                               kl_estimate(LOGPROBS_BT, REF_LOGPROBS_BT, "k3"))


def test_k3_gradient_vanishes_where_policy_equals_reference_and_pulls_towards_it_elsewhere():
    logprobs_BT = LOGPROBS_BT.clone().requires_grad_()
    kl_estimate(logprobs_BT, REF_LOGPROBS_BT, "k3").sum().backward()
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(delta):
    # 1 - exp(-0.5) = 0.39346934, 1 - e = -1.71828183, 1 - 1 = 0
    expected = torch.tensor([[1 - math.exp(-0.5), 1 - math.e, 0.0]])
    torch.testing.assert_close(logprobs_BT.grad, expected, atol=1e-6, rtol=0)


def test_a_fixed_coefficient_never_changes():
    coefficient = KLCoefficient(0.05)
    for kl in (0.0, 1.0, 100.0):
        coefficient.update(kl)
    assert coefficient.value == 0.05


def test_an_adaptive_coefficient_moves_by_the_clipped_relative_error_over_the_horizon():
    coefficient = KLCoefficient(0.1, target=0.01, horizon=10)
    # kl 0.05: error 0.05 / 0.01 - 1 = 4, clipped to 0.2: 0.1 * (1 + 0.2 / 10) = 0.102
    coefficient.update(0.05)
    assert coefficient.value == pytest.approx(0.102, abs=1e-9)
    # kl 0.011: error 0.1, not clipped: 0.102 * (1 + 0.1 / 10) = 0.10302
    coefficient.update(0.011)
    assert coefficient.value == pytest.approx(0.10302, abs=1e-9)
    # kl 0: error -1, clipped to -0.2: 0.10302 * (1 - 0.02) = 0.1009596
    coefficient.update(0.0)
    assert coefficient.value == pytest.approx(0.1009596, abs=1e-9)
