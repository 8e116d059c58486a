"""Rows whose advantages are all 0 are left out of the learner's passes only where that leaves
the update exactly as it was: checked against the full computation, through SGD(lr=1) (a
step's parameter change is minus the gradient) and through AdamW (which moves the weights on
its momentum even when the gradient is 0)."""

import pytest
import torch
from test_learner import _batch, _learner, _model

from tempering.algorithms import AGGREGATIONS, LOSSES, AdvantageInputs
from tempering.algorithms.advantages import grpo
from tempering.config import LearnerConfig
from real_settings import run_settings

# groups 0 and 2 have equal rewards: rows 0-2 and 5-6 carry no signal, rows 3-4 do
REWARDS_B = torch.tensor([0.7, 0.7, 0.7, 1.0, 0.0, 0.3, 0.3])
GROUP_B = torch.tensor([0, 0, 0, 1, 1, 2, 2])


def _signal_batch(model, rewards_B=REWARDS_B):
    batch = _batch(model)
    batch.advantages_BT = grpo(AdvantageInputs(rewards_B, GROUP_B, batch.loss_mask_BT))
    return batch


def _change(skip: bool, rewards_B=REWARDS_B, stale: bool = False, **settings):
    model = _model()
    batch = _signal_batch(model, rewards_B)
    learner = _learner(model, skip_zero_advantage=skip, **settings)
    if stale:
        learner.version = 1  # the batch was sampled by version 0
    before = [p.detach().clone() for p in model.parameters()]
    metrics = learner.step(batch)
    change = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])
    return change, metrics


def test_equal_rewards_give_exactly_zero_advantages_even_when_their_sum_rounds():
    batch_advantages = _signal_batch(_model()).advantages_BT
    assert (batch_advantages[[0, 1, 2, 5, 6]] == 0).all()
    assert (batch_advantages[[3, 4]] != 0).any(dim=1).all()


@pytest.mark.parametrize("loss", ["ppo_clip", "dual_clip", "gspo", "cispo", "reinforce"])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "token_sum_norm"])
def test_skipping_rows_without_signal_leaves_the_step_unchanged(loss, aggregation):
    settings = dict(loss=LOSSES[loss], aggregation=AGGREGATIONS[aggregation], norm_length=6)
    full, full_metrics = _change(False, **settings)
    skipped, metrics = _change(True, **settings)
    assert full.abs().max() > 1e-4, "the step moves the weights"
    torch.testing.assert_close(skipped, full, atol=1e-6, rtol=0)
    assert metrics["loss"] == pytest.approx(full_metrics["loss"], abs=1e-6)
    assert metrics["skipped_rows"] == 5 and full_metrics["skipped_rows"] == 0


def test_skipping_is_exact_for_stale_batches_with_the_off_policy_correction():
    for off_policy in ("tis", "decoupled"):
        full, _ = _change(False, stale=True, off_policy=off_policy)
        skipped, metrics = _change(True, stale=True, off_policy=off_policy)
        torch.testing.assert_close(skipped, full, atol=1e-6, rtol=0)
        assert metrics["skipped_rows"] == 5


def test_terms_that_do_not_vanish_with_the_advantage_keep_every_row():
    for settings in (dict(entropy_coef=0.01), dict(kl_coef=0.1)):
        full, _ = _change(False, **settings)
        kept, metrics = _change(True, **settings)
        assert metrics["skipped_rows"] == 0
        torch.testing.assert_close(kept, full, atol=0, rtol=0)


def test_a_plug_in_loss_is_computed_in_full_unless_it_declares_it_vanishes():
    def plug_in(inputs):
        return LOSSES["ppo_clip"](inputs)

    _, metrics = _change(True, loss=plug_in)
    assert metrics["skipped_rows"] == 0


def test_a_batch_without_signal_still_takes_adamw_s_momentum_step():
    def run(skip: bool) -> list[torch.Tensor]:
        model = _model()
        learner = _learner(model, skip_zero_advantage=skip)
        learner.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        learner.scheduler = torch.optim.lr_scheduler.LambdaLR(learner.optimizer, lambda step: 1.0)
        learner.step(_signal_batch(model))  # builds momentum
        metrics = learner.step(_signal_batch(model, torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.5, 0.5])))
        assert metrics["skipped_rows"] == (6 if skip else 0)  # one row is kept to run the update
        assert metrics["grad_norm"] == 0
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(run(False), run(True)):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=0)


def test_skipping_is_on_by_default():
    assert LearnerConfig().skip_zero_advantage
    assert run_settings().skip_zero_advantage


@pytest.mark.parametrize("off_policy", ["tis", "decoupled"])
def test_one_update_takes_the_proximal_log_probs_from_its_own_forward_pass(off_policy):
    # the reference: the same update with pi_prox from a separate pass, as several updates need
    model = _model()
    batch = _signal_batch(model)
    learner = _learner(model, off_policy=off_policy, is_cap=1.5)
    batch.prox_logprobs_BT = learner.proximal_logprobs(batch, learner.plan(batch))
    before = [p.detach().clone() for p in model.parameters()]
    learner.model.train()
    expected_metrics = learner._update(batch)
    expected = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])

    change, metrics = _change(True, stale=True, off_policy=off_policy, is_cap=1.5)
    assert expected.abs().max() > 1e-4
    torch.testing.assert_close(change, expected, atol=1e-6, rtol=0)
    assert metrics["behaviour_weight"] == pytest.approx(expected_metrics["behaviour_weight"], abs=1e-6)
    assert metrics["behaviour_weight"] != pytest.approx(1.0, abs=1e-3), "the correction is at work"
