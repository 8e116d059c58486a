"""Learner state for checkpoints, the non-finite guard, and the off-policy correction."""

import io
import math

import pytest
import torch

from tempering.learner.step import Learner, collate
from tempering.models.tiny import build_model
from tempering.types import Problem, Rollout
from real_settings import run_settings

PROBLEM = Problem(task="t", id="0", prompt="", answer="0")


def _model(seed=0):
    return build_model(vocab_size=12, hidden_size=16, layers=1, heads=2, max_positions=32, seed=seed,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _learner(model, **settings):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return Learner(model, optimizer, lambda step: 1.0 / (step + 1),
                   run_settings(**settings))


def _batch(logprob=-1.0, version=0):
    rollouts = [Rollout(PROBLEM, [3, 4], [5, 6, 7], [logprob] * 3, "", "stop", version),
                Rollout(PROBLEM, [3], [8, 9], [logprob] * 2, "", "stop", version)]
    batch = collate(rollouts, 0)
    batch.advantages_BT = batch.loss_mask_BT * torch.tensor([[1.0], [-1.0]])
    return batch


def test_state_dict_round_trip_continues_identically():
    a, b = _model(), _model()
    la, lb = _learner(a, kl_coef=0.1), _learner(b, kl_coef=0.1)
    la.step(_batch())
    saved = io.BytesIO()  # through bytes, as a checkpoint does (a live state dict shares tensors)
    torch.save(la.state_dict(), saved)
    saved.seek(0)
    lb.load_state_dict(torch.load(saved, weights_only=False))
    b.load_state_dict(a.state_dict())
    assert lb.version == 1 and lb.scheduler.last_epoch == la.scheduler.last_epoch
    la.step(_batch())
    lb.step(_batch())
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


def test_a_non_finite_gradient_skips_the_update_and_says_so():
    model = _model()
    learner = _learner(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = _batch()
    batch.advantages_BT[0, 2] = float("nan")
    record = learner.step(batch)
    assert record["skipped_updates"] == 1 and not math.isfinite(record["grad_norm"])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "weights untouched"
    assert learner.version == 1, "the version still moves: the batch was consumed"
    assert learner.step(_batch())["skipped_updates"] == 0


@pytest.mark.parametrize("mode", ["tis", "decoupled"])
def test_off_policy_correction_weights_tokens_by_proximal_over_behaviour(mode):
    # behaviour log-probs far below the current policy's: weight pi_prox / pi_behaviour is large
    model = _model()
    learner = _learner(model, off_policy=mode, is_cap=2.0)
    learner.version = 1  # the batch (version 0) is one update old: stale, so it is corrected
    record = learner.step(_batch(logprob=-20.0))
    if mode == "tis":
        assert record["behaviour_weight"] == pytest.approx(2.0), "truncated at is_cap"
    else:
        assert record["behaviour_weight"] > 1e5
    fresh = _learner(_model(), off_policy=mode).step(_batch(logprob=-20.0))
    assert "behaviour_weight" not in fresh, "a batch from the current version needs no correction"
    with pytest.raises(ValueError, match="off_policy"):
        _learner(_model(), off_policy="bogus")
