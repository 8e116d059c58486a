"""The learner beyond one plain update: several updates per batch, entropy bonus, KL in the
reward or adaptive, and the critic. Checked through SGD(lr=1), so a step's parameter change
is exactly minus the accumulated gradient."""

import copy

import pytest
import torch
from test_learner import PROBLEM, TEMPERATURE, _batch, _learner, _model, _rollout

from tempering.algorithms import ADVANTAGES, AGGREGATIONS, token_logprobs
from tempering.algorithms.logprobs import logprobs_from_logits
from tempering.train import make_batch
from tempering.types import Group


def _params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_ppo_epochs_repeat_the_update_against_the_samplers_logprobs():
    # Two epochs in one step = two one-epoch steps on the same batch: the second update's
    # importance ratio is against the batch's (sampler's) log-probs, not the updated policy's.
    # Without off-policy correction: with it (a run's default), the second one-epoch step sees a
    # batch older than the learner and takes its ratios against the proximal policy instead.
    model_a, model_b = _model(), _model()
    batch = _batch(model_a)
    start = _params(model_a)
    epochs = _learner(model_a, ppo_epochs=2, off_policy="none")
    once = _learner(model_b, off_policy="none")

    metrics = epochs.step(batch)
    once.step(batch)
    second = once.step(batch)

    torch.testing.assert_close(_params(model_a), _params(model_b), atol=1e-6, rtol=0)
    assert not torch.allclose(_params(model_a), start)
    assert epochs.version == 1 and once.version == 2, "the policy version counts batches, not updates"
    assert second["ratio_mean"] != pytest.approx(1.0, abs=1e-4), "the second update is off-policy"
    assert metrics["ratio_mean"] != pytest.approx(second["ratio_mean"], abs=1e-6), "metrics average both updates"


def test_mini_batches_partition_the_batch_afresh_each_epoch_and_each_is_one_update():
    model = _model()
    batch = _batch(model)
    learner = _learner(model, ppo_epochs=2, mini_batches=3)
    first, second = learner._mini_batches(7, 0), learner._mini_batches(7, 1)
    for rows in (first, second):
        assert sorted(torch.cat(rows).tolist()) == list(range(7)), "every row once per epoch"
        assert [len(r) for r in rows] == [3, 2, 2]
    assert torch.cat(first).tolist() != torch.cat(second).tolist()

    calls = []
    step = learner.optimizer.step
    learner.optimizer.step = lambda *a, **k: (calls.append(1), step(*a, **k))[1]
    lrs = []
    learner.scheduler.step = lambda *a, **k: lrs.append(1)
    learner.step(batch)
    assert len(calls) == 2 * 3, "ppo_epochs * mini_batches optimizer updates"
    assert len(lrs) == 1, "the LR schedule advances once per batch"


def test_the_entropy_bonus_adds_minus_coef_times_the_entropy_gradient():
    model = _model()
    batch = _batch(model)
    batch.advantages_BT = torch.zeros_like(batch.advantages_BT)  # the policy loss has no gradient
    reference = copy.deepcopy(model)
    before = _params(model)

    metrics = _learner(model, entropy_coef=0.1).step(batch)

    # expected: SGD moves by -grad(loss) = -grad(-0.1 * token_mean(entropy)) = 0.1 * grad(token_mean(entropy))
    logits = reference(input_ids=batch.input_ids_BT, attention_mask=batch.attention_mask_BT).logits
    _, entropy_BT = logprobs_from_logits(logits, batch.input_ids_BT, TEMPERATURE, with_entropy=True, entropy_grad=True)
    mean_entropy = (entropy_BT * batch.loss_mask_BT).sum() / batch.num_tokens
    mean_entropy.backward()
    expected = 0.1 * torch.cat([p.grad.flatten() for p in reference.parameters()])
    torch.testing.assert_close(_params(model) - before, expected, atol=1e-6, rtol=0)
    assert metrics["entropy"] == pytest.approx(mean_entropy.item(), abs=1e-6)


def test_kl_in_the_reward_is_coef_times_the_samplers_kl_and_stays_out_of_the_loss():
    model = _model()
    batch = _batch(model)
    learner = _learner(model, kl_coef=0.5, kl_in_reward=True, kl_estimator="k1")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))

    penalty_BT = learner.reward_penalty(batch)

    # k1 = -(ref - old) per trained token, times 0.5; the sampler's log-probs, not the policy's
    ref_BT, _ = token_logprobs(learner.reference, batch.input_ids_BT, batch.attention_mask_BT, TEMPERATURE)
    expected_BT = 0.5 * (batch.old_logprobs_BT - ref_BT) * batch.loss_mask_BT
    torch.testing.assert_close(penalty_BT, expected_BT, atol=1e-6, rtol=0)

    plain = _model()
    with torch.no_grad():
        for p, q in zip(plain.parameters(), model.parameters()):
            p.copy_(q)
    metrics, plain_metrics = learner.step(batch), _learner(plain).step(batch)
    torch.testing.assert_close(_params(model), _params(plain), atol=1e-6, rtol=0)
    assert metrics["loss"] == pytest.approx(plain_metrics["loss"], abs=1e-6)
    kl = float((expected_BT / 0.5).sum() / batch.num_tokens)
    assert metrics["kl"] == pytest.approx(kl, abs=1e-6) and metrics["kl_coef"] == 0.5


def test_the_kl_clamp_bounds_each_tokens_kl_in_the_reward():
    model = _model()
    batch = _batch(model)
    learner = _learner(model, kl_coef=0.5, kl_in_reward=True, kl_estimator="k1", kl_clamp=0.01)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))

    penalty_BT = learner.reward_penalty(batch)

    ref_BT, _ = token_logprobs(learner.reference, batch.input_ids_BT, batch.attention_mask_BT, TEMPERATURE)
    k1_BT = (batch.old_logprobs_BT - ref_BT) * batch.loss_mask_BT
    assert k1_BT.abs().max() > 0.01, "some tokens' KL is past the clamp"
    torch.testing.assert_close(penalty_BT, 0.5 * k1_BT.clamp(-0.01, 0.01), atol=1e-6, rtol=0)


def test_an_adaptive_kl_coefficient_follows_the_measured_kl():
    model = _model()
    batch = _batch(model)
    learner = _learner(model, kl_coef=0.2, kl_target=1e-3, kl_horizon=4)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))

    metrics = learner.step(batch)

    # the step used 0.2; then error = clip(kl / 1e-3 - 1, -0.2, 0.2), value 0.2 * (1 + error / 4)
    assert metrics["kl_coef"] == 0.2
    error = min(max(metrics["kl"] / 1e-3 - 1, -0.2), 0.2)
    assert learner.kl.value == pytest.approx(0.2 * (1 + error / 4))


def _critic_batch(learner):
    """Two groups; gae with a zero-initialised head (values 0) and gamma = lam = 1: advantage = reward."""
    rollouts = [_rollout([5, 6], [7, 8, 9], [-1.0] * 3), _rollout([5], [7, 8], [-1.0] * 2)]
    rollouts[0].reward, rollouts[1].reward = 1.0, 0.0
    return make_batch([Group(PROBLEM, rollouts)], ADVANTAGES["gae"], 0, learner)


def test_make_batch_with_a_critic_stores_old_values_and_returns():
    model = _model()
    learner = _learner(model, critic="head")
    batch = _critic_batch(learner)
    torch.testing.assert_close(batch.values_BT, torch.zeros_like(batch.values_BT))
    # reward 1 on all three trained tokens of row 0, 0 on row 1; returns = advantages + values
    expected_BT = torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0],
                                [0.0, 0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(batch.advantages_BT, expected_BT)
    torch.testing.assert_close(batch.returns_BT, expected_BT)


@pytest.mark.parametrize("critic, moves_policy", [("head", True), ("model", False)])
def test_the_value_loss_trains_the_critic_and_the_policy_trunk_only_when_shared(critic, moves_policy):
    model = _model()
    learner = _learner(model, critic=critic, value_clip=0.0, aggregation=AGGREGATIONS["token_mean"])
    batch = _critic_batch(learner)
    batch.advantages_BT = torch.zeros_like(batch.advantages_BT)  # no policy-gradient term
    policy_before = _params(model)
    head_before = torch.cat([p.detach().flatten() for p in learner.critic.head.parameters()])

    metrics = learner.step(batch)

    # values 0, returns 1 on 3 tokens and 0 on 2: token-mean of 0.5 * (0 - R)² = (3 * 0.5) / 5 = 0.3
    assert metrics["value_loss"] == pytest.approx(0.3, abs=1e-6)
    head_after = torch.cat([p.detach().flatten() for p in learner.critic.head.parameters()])
    assert not torch.equal(head_after, head_before)
    # the zero-initialised head passes no gradient to its trunk on the first update; on the
    # second it does, and a shared trunk is the policy
    torch.testing.assert_close(_params(model), policy_before, atol=0, rtol=0)
    learner.step(batch)
    assert (not torch.equal(_params(model), policy_before)) == moves_policy


def test_a_step_reports_its_updates_and_micro_batches_per_update():
    # 7 rows, 2 epochs x 3 mini-batches of 3, 2 and 2 rows, micro-batches of 2 rows: 2, 1, 1 per epoch
    model = _model()
    learner = _learner(model, ppo_epochs=2, mini_batches=3, micro_batch_size=2, skip_zero_advantage=False,
                       merge_duplicates=False)
    metrics = learner.step(_batch(model))
    assert metrics["updates"] == 6
    assert metrics["micro_batches"] == pytest.approx((2 + 1 + 1) / 3)
