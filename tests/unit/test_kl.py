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


def _value_and_gradient(estimator, clamp=0.0):
    logprobs_BT = LOGPROBS_BT.clone().requires_grad_()
    kl_BT = kl_estimate(logprobs_BT, REF_LOGPROBS_BT, estimator, clamp)
    kl_BT.sum().backward()
    return kl_BT.detach(), logprobs_BT.grad


def test_abs_is_the_absolute_log_ratio_with_gradient_its_sign():
    # |delta| = 0.5, 1, 0; d/dlogp |ref - logp| = -sign(delta): 1, -1, and 0 at delta = 0
    value, gradient = _value_and_gradient("abs")
    torch.testing.assert_close(value, torch.tensor([[0.5, 1.0, 0.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(gradient, torch.tensor([[1.0, -1.0, 0.0]]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("estimator, expected", [
    ("k1+", [[0.5, -1.0, 0.0]]),                                      # -delta
    ("k3+", [[math.exp(-0.5) - 0.5, math.e - 2.0, 0.0]]),             # exp(delta) - delta - 1
])
def test_straight_through_estimators_have_the_value_of_k1_or_k3_and_the_gradient_of_k2(estimator, expected):
    # d/dlogp (ref - logp)^2 / 2 = -delta = logp - ref: 0.5, -1, 0 (k3's own would be 1 - exp(delta))
    value, gradient = _value_and_gradient(estimator)
    torch.testing.assert_close(value, torch.tensor(expected), atol=1e-6, rtol=0)
    torch.testing.assert_close(gradient, torch.tensor([[0.5, -1.0, 0.0]]), atol=1e-6, rtol=0)


def test_a_clamp_bounds_the_value_and_cuts_the_gradient_of_plain_estimators_only():
    # clamp 0.3 on k3 = 0.10653066, 0.71828183, 0: the middle one becomes 0.3 and stops pulling
    value, gradient = _value_and_gradient("k3", clamp=0.3)
    torch.testing.assert_close(value, torch.tensor([[math.exp(-0.5) - 0.5, 0.3, 0.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(gradient, torch.tensor([[1 - math.exp(-0.5), 0.0, 0.0]]), atol=1e-6, rtol=0)
    # k3+: the value is clamped the same way, the gradient stays k2's
    value, gradient = _value_and_gradient("k3+", clamp=0.3)
    torch.testing.assert_close(value, torch.tensor([[math.exp(-0.5) - 0.5, 0.3, 0.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(gradient, torch.tensor([[0.5, -1.0, 0.0]]), atol=1e-6, rtol=0)


def test_k3_stays_finite_where_exp_of_the_log_ratio_overflows():
    # delta = 100: exp(100) is inf in float32, so k3 was inf with gradient -inf. The log-ratio is
    # clamped to 20 first: e^20 - 20 - 1 = 485165174.4, and no gradient past the clamp.
    logprobs_BT = torch.tensor([[-101.0, -1.0]], requires_grad=True)
    ref_BT = torch.tensor([[-1.0, -101.0]])
    kl_BT = kl_estimate(logprobs_BT, ref_BT, "k3")
    kl_BT.sum().backward()
    # delta = -100 is clamped to -20 too: e^-20 + 20 - 1 = 19.0000000021
    torch.testing.assert_close(kl_BT.detach(), torch.tensor([[math.exp(20) - 21, math.exp(-20) + 19]]),
                               rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(logprobs_BT.grad, torch.zeros(1, 2), atol=0, rtol=0)
