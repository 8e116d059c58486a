"""KL estimators between the policy and the reference, on hand-computed log-probs."""

import math

import torch

from tempering.algorithms import kl_estimate

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
