"""The learner: collation, the LR schedule, and micro-batching that leaves the step unchanged.

The step is checked through plain SGD with learning rate 1 and no clipping, so the change of
every parameter is exactly minus its accumulated gradient.
"""

import pytest
import torch

from tempering.algorithms import AGGREGATIONS, AdvantageInputs
from tempering.algorithms.advantages import grpo
from tempering.learner.forward import token_logprobs
from tempering.learner.optim import lr_factor
from tempering.learner.step import Learner, collate
from tempering.models.tiny import build_model
from tempering.types import Problem, Rollout
from real_settings import run_settings

VOCAB = 12
PAD = 0
TEMPERATURE = 0.7
PROBLEM = Problem(task="t", id="0", prompt="", answer="0")


def _rollout(prompt_ids, completion_ids, logprobs, loss_mask=None, version=0) -> Rollout:
    return Rollout(problem=PROBLEM, prompt_ids=prompt_ids, completion_ids=completion_ids, logprobs=logprobs,
                   text="", finish_reason="length", policy_version=version, loss_mask=loss_mask or [])


def test_collate_right_pads_and_aligns_mask_and_old_logprobs_with_completion_tokens():
    batch = collate([
        _rollout([5, 6], [7, 8], [-0.1, -0.2], loss_mask=[1, 0], version=3),
        _rollout([5, 6, 7], [9, 10, 11], [-1.0, -2.0, -3.0], version=4),
    ], pad_id=PAD)

    assert batch.input_ids_BT.tolist() == [[5, 6, 7, 8, 0, 0],
                                           [5, 6, 7, 9, 10, 11]]
    assert batch.attention_mask_BT.tolist() == [[1, 1, 1, 1, 0, 0],
                                                [1, 1, 1, 1, 1, 1]]
    assert batch.loss_mask_BT.tolist() == [[0, 0, 1, 0, 0, 0],
                                           [0, 0, 0, 1, 1, 1]]
    # the masked-out token's old log-prob is zeroed like padding
    torch.testing.assert_close(batch.old_logprobs_BT, torch.tensor([[0.0, 0.0, -0.1, 0.0, 0.0, 0.0],
                                                                    [0.0, 0.0, 0.0, -1.0, -2.0, -3.0]]))
    assert batch.policy_versions_B.tolist() == [3, 4]
    assert batch.num_tokens == 4
    micro = batch.select(slice(0, 1))
    assert micro.input_ids_BT.tolist() == [[5, 6, 7, 8]], "all-padding columns are trimmed"


def test_lr_factor_warms_up_linearly_then_follows_the_schedule():
    # warm-up: (step + 1) / warmup
    assert [lr_factor(s, 4, 100, "constant") for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    # cosine from step 0 to 10, floor 0.1: 0.1 + 0.9 * 0.5 * (1 + cos(pi * progress))
    assert lr_factor(0, 0, 10, "cosine", 0.1) == pytest.approx(1.0)
    assert lr_factor(5, 0, 10, "cosine", 0.1) == pytest.approx(0.55)  # cos(pi / 2) = 0
    assert lr_factor(10, 0, 10, "cosine", 0.1) == pytest.approx(0.1)
    assert lr_factor(50, 0, 10, "cosine", 0.1) == pytest.approx(0.1), "stays at the floor after the end"
    assert lr_factor(7, 2, 12, "linear", 0.0) == pytest.approx(0.5)  # progress (7 - 2) / 10


def _model():
    return build_model(vocab_size=VOCAB, hidden_size=16, layers=2, heads=2, max_positions=32, seed=0,
                       pad_token_id=PAD, bos_token_id=1, eos_token_id=2)


def _batch(model):
    """Seven rollouts of different lengths in three groups, one with a masked-out token.

    Old log-probs are the model's own plus noise, so that some ratios leave the clip range.
    """
    gen = torch.Generator().manual_seed(1)
    shapes = [(3, 2), (1, 5), (4, 4), (2, 1), (5, 3), (2, 6), (3, 3)]
    rollouts = []
    for prompt_len, completion_len in shapes:
        ids = torch.randint(3, VOCAB, (prompt_len + completion_len,), generator=gen).tolist()
        rollouts.append(_rollout(ids[:prompt_len], ids[prompt_len:], [0.0] * completion_len))
    rollouts[2].loss_mask = [1, 0, 1, 1]
    batch = collate(rollouts, PAD)
    with torch.no_grad():
        current_BT, _ = token_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT, TEMPERATURE)
    noise_BT = 0.3 * torch.randn(current_BT.shape, generator=gen)
    batch.old_logprobs_BT = (current_BT + noise_BT) * batch.loss_mask_BT
    rewards_B = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 1.0])
    group_B = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    batch.advantages_BT = grpo(AdvantageInputs(rewards_B, group_B, batch.loss_mask_BT))
    return batch


def _learner(model, **settings) -> Learner:
    """A learner with plain SGD(lr=1) and a constant schedule; ``settings`` override the defaults."""
    return Learner(model, torch.optim.SGD(model.parameters(), lr=1.0), lambda step: 1.0,
                   run_settings(**{"temperature": TEMPERATURE, "grad_clip": 0.0, **settings}))


def _sgd_step(micro_batch_size, aggregation="token_mean", kl_coef=0.0, grad_clip=0.0):
    """Parameter change (= minus the gradient) and metrics of one SGD(lr=1) learner step."""
    model = _model()
    batch = _batch(model)
    learner = _learner(model, aggregation=AGGREGATIONS[aggregation], kl_coef=kl_coef,
                       micro_batch_size=micro_batch_size, grad_clip=grad_clip)
    if kl_coef:
        # move the policy away from its frozen reference, so that the KL term has a gradient
        gen = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    before = [p.detach().clone() for p in model.parameters()]
    metrics = learner.step(batch)
    change = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])
    return change, metrics


@pytest.mark.parametrize("aggregation, kl_coef", [
    ("token_mean", 0.0),
    ("seq_mean_token_mean", 0.0),
    ("token_mean", 0.5),
])
def test_micro_batching_gives_the_same_step_as_one_full_batch(aggregation, kl_coef):
    full, full_metrics = _sgd_step(64, aggregation, kl_coef)
    assert full.abs().max() > 1e-3, "the step must move the parameters for the comparison to mean anything"
    assert 0 < full_metrics["clip_fraction"] < 1, "some tokens clipped, some not"
    if kl_coef:
        assert full_metrics["kl"] > 0

    for micro_batch_size in (1, 3):
        change, metrics = _sgd_step(micro_batch_size, aggregation, kl_coef)
        torch.testing.assert_close(change, full, atol=1e-6, rtol=0)
        for key in ("loss", "clip_fraction", "ratio_mean", "entropy", "grad_norm"):
            assert metrics[key] == pytest.approx(full_metrics[key], abs=1e-6), key


def test_gradient_clipping_bounds_the_step_and_reports_the_norm_before_clipping():
    unclipped, unclipped_metrics = _sgd_step(64)
    clipped, metrics = _sgd_step(64, grad_clip=1e-3)
    assert unclipped.norm() > 1e-3
    assert metrics["grad_norm"] == pytest.approx(float(unclipped.norm()), rel=1e-5)
    assert float(clipped.norm()) == pytest.approx(1e-3, rel=1e-4)
    # clipping scales the whole gradient: same direction
    torch.testing.assert_close(clipped, unclipped * (1e-3 / unclipped.norm()), atol=1e-7, rtol=0)


def test_each_step_uses_the_scheduled_learning_rate_and_bumps_the_policy_version():
    model = _model()
    batch = _batch(model)
    settings = run_settings(temperature=TEMPERATURE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    learner = Learner(model, optimizer, lambda step: lr_factor(step, 2, 4, "linear", 0.0), settings)

    lrs = [learner.step(batch)["lr"] for _ in range(4)]

    # warm-up 0.5, 1.0; then linear decay over the remaining 2 steps: 1.0, 0.5
    assert lrs == pytest.approx([0.005, 0.01, 0.01, 0.005])
    assert learner.version == 4
    assert learner.reference is None, "no reference model is kept when kl_coef is 0"


def test_the_training_optimizer_is_fused_adamw_and_updates_as_the_loop_does():
    from tempering.learner.optim import adamw

    fused_model, loop_model = _model(), _model()
    fused = adamw(fused_model, 1e-2, (0.9, 0.99), 0.01)
    assert fused.defaults["fused"]
    loop = torch.optim.AdamW(loop_model.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.01, foreach=False)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        for a, b in zip(fused_model.parameters(), loop_model.parameters()):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()
        fused.step()
        loop.step()
    for a, b in zip(fused_model.parameters(), loop_model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    moved = max(float((a - b).detach().abs().max()) for a, b in zip(fused_model.parameters(), _model().parameters()))
    assert moved > 1e-3, "the steps must move the weights for the comparison to mean anything"
