"""Correction for a sampler that is not the learner, through the learner's step on a fresh batch
(``pipeline.mismatch_correction``): what it masks and truncates, against the hand-computed ratios."""

import pytest
import torch
from test_learner import TEMPERATURE, _batch, _learner, _model

from tempering.learner.forward import token_logprobs


def _ratios(model, batch):
    """``w = pi_learner / pi_sampler`` of the batch's trained tokens, before any update."""
    with torch.no_grad():
        current_BT, _ = token_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT, TEMPERATURE)
    mask_BT = batch.loss_mask_BT.bool()
    return (current_BT - batch.old_logprobs_BT)[mask_BT].exp()


def test_masked_tokens_are_the_ones_whose_ratio_leaves_the_band():
    model = _model()
    batch = _batch(model)
    w = _ratios(model, batch)
    metrics = _learner(model, mismatch_correction="mis_token", mismatch_low=0.8, mismatch_high=1.25,
                       entropy_coef=0.0, skip_zero_advantage=False).step(batch)
    kept = (w >= 0.8) & (w <= 1.25)
    assert 0 < kept.sum() < len(w), "the batch's noise puts some tokens on each side"
    assert metrics["mismatch/masked"] == pytest.approx(float((~kept).float().mean()), abs=1e-6)
    assert metrics["mismatch/is_weight"] == pytest.approx(float((w * kept).mean()), abs=1e-5)


def test_a_batch_with_every_token_outside_the_band_moves_nothing():
    model = _model()
    batch = _batch(model)
    start = [p.detach().clone() for p in model.parameters()]
    metrics = _learner(model, mismatch_correction="mis_sequence", mismatch_low=50.0, mismatch_high=60.0,
                       entropy_coef=0.0, skip_zero_advantage=False).step(batch)
    assert metrics["mismatch/masked"] == 1.0
    assert all(torch.equal(a, p) for a, p in zip(start, model.parameters()))


def test_truncation_caps_each_tokens_weight_at_the_band_top():
    model = _model()
    batch = _batch(model)
    w = _ratios(model, batch)
    metrics = _learner(model, mismatch_correction="tis", mismatch_high=1.0, entropy_coef=0.0, skip_zero_advantage=False).step(batch)
    assert metrics["mismatch/truncated"] == pytest.approx(float((w > 1.0).float().mean()), abs=1e-6)
    assert metrics["mismatch/is_weight"] == pytest.approx(float(w.clamp(max=1.0).mean()), abs=1e-5)
    assert metrics["mismatch/masked"] == 0.0


@pytest.mark.parametrize("name", ["tis", "mis_token", "mis_sequence"])
def test_a_ratio_beyond_floating_point_range_is_masked_or_cut_not_nan(name):
    from tempering.algorithms.correction import correct

    prox_BT = torch.zeros(2, 2000)
    prox_BT[1, 0] = 100.0  # one token the engines disagree on wildly (exp overflows float32)
    sampler_BT = torch.full((2, 2000), -0.05)  # a long sequence: its ratio's product overflows too
    weight_BT, metrics = correct(name, prox_BT, sampler_BT, torch.ones(2, 2000), 0.5, 2.0)
    assert torch.isfinite(weight_BT).all() and all(value == value for value in metrics.values()), metrics


@pytest.mark.parametrize("name", ["mis_token", "mis_sequence"])
def test_a_band_that_keeps_no_ratio_is_refused_before_the_model_loads(name):
    from tempering.build import check_mismatch_band
    from tempering.config import ConfigError, TrainConfig

    config = TrainConfig.model_validate({"pipeline": {"mismatch_correction": name, "mismatch_low": 3.0, "mismatch_high": 2.0}})
    with pytest.raises(ConfigError, match="pipeline.mismatch_low=3.0 is above pipeline.mismatch_high=2.0"):
        check_mismatch_band(config)
    check_mismatch_band(TrainConfig.model_validate({"pipeline": {"mismatch_correction": name}}))
