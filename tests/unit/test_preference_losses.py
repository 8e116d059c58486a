"""The DPO family's losses on inputs whose values and gradients are worked out by hand."""

import math

import pytest
import torch

from tempering.algorithms.preference import (
    PREFERENCE_LOSSES,
    PairInputs,
    UnpairedInputs,
    dpo,
    ipo,
    kto,
    kto_kl,
    simpo,
)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _pair(beta=0.5, label_smoothing=0.0, gamma=0.5) -> PairInputs:
    """One pair: chosen log-prob -3 over 2 tokens (reference -4), rejected -5 over 4 (reference -4.5):
    log-ratios +1 and -0.5."""
    return PairInputs(chosen_logps_B=torch.tensor([-3.0], requires_grad=True),
                      rejected_logps_B=torch.tensor([-5.0], requires_grad=True),
                      chosen_lengths_B=torch.tensor([2]), rejected_lengths_B=torch.tensor([4]),
                      ref_chosen_logps_B=torch.tensor([-4.0]), ref_rejected_logps_B=torch.tensor([-4.5]),
                      beta=beta, label_smoothing=label_smoothing, gamma=gamma)


def _grads(inputs: PairInputs, loss_B: torch.Tensor) -> tuple[float, float]:
    loss_B.sum().backward()
    return inputs.chosen_logps_B.grad.item(), inputs.rejected_logps_B.grad.item()


def test_dpo_is_the_logistic_loss_on_the_log_ratio_margin():
    inputs = _pair()
    loss_B, rewards = dpo(inputs)
    # d = 1 - (-0.5) = 1.5, beta d = 0.75: -log sigmoid(0.75); d loss / d logp_c = -beta sigmoid(-0.75)
    assert loss_B.item() == pytest.approx(math.log(1 + math.exp(-0.75)), abs=1e-6)
    chosen, rejected = _grads(inputs, loss_B)
    assert chosen == pytest.approx(-0.5 * sigmoid(-0.75), abs=1e-6)
    assert rejected == pytest.approx(0.5 * sigmoid(-0.75), abs=1e-6)
    assert rewards["rewards/chosen"].item() == pytest.approx(0.5) and rewards["rewards/rejected"].item() == pytest.approx(-0.25)


def test_dpo_label_smoothing_mixes_in_the_flipped_label():
    inputs = _pair(label_smoothing=0.1)
    loss_B, _ = dpo(inputs)
    assert loss_B.item() == pytest.approx(0.9 * math.log(1 + math.exp(-0.75)) + 0.1 * math.log(1 + math.exp(0.75)),
                                          abs=1e-6)
    chosen, _ = _grads(inputs, loss_B)
    # d/dx of -(0.9) log s(bx) - 0.1 log s(-bx) = -b (0.9 s(-bx) - 0.1 s(bx))
    assert chosen == pytest.approx(-0.5 * (0.9 * sigmoid(-0.75) - 0.1 * sigmoid(0.75)), abs=1e-6)


def test_ipo_squares_the_per_token_margin_against_one_over_two_beta():
    inputs = _pair()
    loss_B, _ = ipo(inputs)
    # 1/2 - (-0.5)/4 = 0.625 against 1 / (2 * 0.5) = 1: (0.625 - 1)^2; gradients 2 (-0.375) / 2 and 2 (-0.375) (-1/4)
    assert loss_B.item() == pytest.approx(0.140625, abs=1e-6)
    assert _grads(inputs, loss_B) == pytest.approx((-0.375, 0.1875), abs=1e-6)


def test_simpo_needs_no_reference_and_normalises_by_length():
    inputs = _pair(beta=2.0, gamma=0.5)
    inputs.ref_chosen_logps_B = inputs.ref_rejected_logps_B = None
    loss_B, rewards = simpo(inputs)
    # -3/2 - (-5/4) - 0.5/2 = -0.5, beta x = -1: -log sigmoid(-1); d/d logp_c = -2 sigmoid(1) / 2
    assert loss_B.item() == pytest.approx(math.log(1 + math.e), abs=1e-6)
    assert _grads(inputs, loss_B) == pytest.approx((-sigmoid(1.0), 0.5 * sigmoid(1.0)), abs=1e-6)
    assert rewards["rewards/chosen"].item() == pytest.approx(-3.0) and rewards["rewards/rejected"].item() == -2.5
    assert not simpo.reference and dpo.reference and ipo.reference


def test_kto_pulls_desirable_and_pushes_undesirable_against_the_kl_point():
    logps_B = torch.tensor([-1.0, -2.0], requires_grad=True)
    inputs = UnpairedInputs(logps_B=logps_B, ref_logps_B=torch.tensor([-2.0, -2.2]),
                            desirable_B=torch.tensor([True, False]), kl=torch.tensor(0.3), beta=0.5,
                            desirable_weight=1.0, undesirable_weight=2.0)
    loss_B, rewards = kto(inputs)
    # log-ratios 1.0 and 0.2: 1 - sigmoid(0.5 (1.0 - 0.3)) and 2 (1 - sigmoid(0.5 (0.3 - 0.2)))
    expected = [1 - sigmoid(0.35), 2 * (1 - sigmoid(0.05))]
    assert loss_B.tolist() == pytest.approx(expected, abs=1e-6)
    loss_B.sum().backward()
    # d/dr of 1 - s(b (r - z)) is -b s'(.); of 2 (1 - s(b (z - r))) is +2 b s'(.)
    grads = [-0.5 * sigmoid(0.35) * (1 - sigmoid(0.35)), 2 * 0.5 * sigmoid(0.05) * (1 - sigmoid(0.05))]
    assert logps_B.grad.tolist() == pytest.approx(grads, abs=1e-6)
    assert rewards["rewards/chosen"].tolist() == pytest.approx([0.5]) and rewards["rewards/rejected"].tolist() == pytest.approx([0.1])
    assert not kto.paired


def test_the_kto_kl_point_is_the_mean_mismatched_log_ratio_floored_at_zero():
    kl_logps_B = torch.tensor([-1.0, -2.0], requires_grad=True)
    kl = kto_kl(kl_logps_B, torch.tensor([-1.5, -3.0]))
    assert kl.item() == pytest.approx(0.75) and not kl.requires_grad
    assert kto_kl(torch.tensor([-2.0]), torch.tensor([-1.0])).item() == 0.0


def test_the_registry_holds_the_family():
    assert {"dpo", "ipo", "simpo", "kto"} <= set(PREFERENCE_LOSSES)
