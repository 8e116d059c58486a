"""Identical rows of a batch (a group's samples that came out the same) are computed once,
weighted by their count: the update must be the one of every row computed (fp32, 1e-5),
through SGD(lr=1), where a step's parameter change is exactly minus the gradient."""

import pytest
import torch
from test_learner import PAD, TEMPERATURE, VOCAB, _learner, _model, _rollout

from tempering.algorithms import AGGREGATIONS, LOSSES, AdvantageInputs
from tempering.algorithms.advantages import grpo
from tempering.learner.forward import token_logprobs
from tempering.learner.step import collate


def _duplicate_batch(model, stale: bool = False):
    """Two groups of four samples; in the first, samples 0, 1 and 3 are the same (and so get
    the same reward and advantage), in the second, samples 0 and 2. Old log-probs are the
    model's own plus noise that is the same for identical rows, as the sampler records them."""
    gen = torch.Generator().manual_seed(1)
    rollouts, rewards, groups = [], [], []
    for group, (same, reward_same, reward_other) in enumerate([((0, 1, 3), 1.0, 0.0), ((0, 2), 0.0, 1.0)]):
        prompt = torch.randint(3, VOCAB, (3 + group,), generator=gen).tolist()
        repeated = torch.randint(3, VOCAB, (4,), generator=gen).tolist()
        for sample in range(4):
            completion = repeated if sample in same else torch.randint(3, VOCAB, (2 + sample,), generator=gen).tolist()
            rollouts.append(_rollout(prompt, completion, [0.0] * len(completion), version=0 if stale else 1))
            rewards.append(reward_same if sample in same else reward_other)
            groups.append(group)
    batch = collate(rollouts, PAD)
    with torch.no_grad():
        current_BT, _ = token_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT, TEMPERATURE)
    noise_T = 0.3 * torch.randn(batch.input_ids_BT.shape[1], generator=gen)
    batch.old_logprobs_BT = (current_BT + noise_T) * batch.loss_mask_BT
    batch.advantages_BT = grpo(AdvantageInputs(torch.tensor(rewards), torch.tensor(groups), batch.loss_mask_BT))
    return batch


def _sgd_change(merge, batch_change=None, **settings):
    model = _model()
    batch = _duplicate_batch(model)
    if batch_change:
        batch_change(batch)
    learner = _learner(model, merge_duplicates=merge, **settings)
    learner.version = 1
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    metrics = learner.step(batch)
    return before - torch.cat([p.detach().flatten() for p in model.parameters()]), metrics


@pytest.mark.parametrize("loss", ["ppo_clip", "gspo", "cispo"])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "token_sum_norm"])
def test_merging_identical_rows_is_the_update_of_every_row(loss, aggregation):
    settings = dict(loss=LOSSES[loss], aggregation=AGGREGATIONS[aggregation])
    alone, alone_metrics = _sgd_change(False, **settings)
    merged, metrics = _sgd_change(True, **settings)
    assert alone.abs().max() > 1e-3
    assert alone_metrics["merged_rows"] == 0 and metrics["merged_rows"] == 3  # 2 + 1 copies
    torch.testing.assert_close(merged, alone, atol=1e-5, rtol=0)
    assert metrics["loss"] == pytest.approx(alone_metrics["loss"], abs=1e-6)


def test_weights_multiply_with_the_counts_and_off_policy_corrections_still_apply():
    def weigh(batch):
        batch.weights_B = torch.linspace(0.5, 1.5, len(batch))
        batch.weights_B[[1, 3]] = float(batch.weights_B[0])  # the copies must agree to be merged
        batch.weights_B[6] = float(batch.weights_B[4])
    alone, _ = _sgd_change(False, weigh)
    merged, metrics = _sgd_change(True, weigh)
    assert metrics["merged_rows"] == 3
    torch.testing.assert_close(merged, alone, atol=1e-5, rtol=0)

    def stale(batch):
        batch.policy_versions_B[:] = 0
    alone, _ = _sgd_change(False, stale, off_policy="tis")
    merged, metrics = _sgd_change(True, stale, off_policy="tis")
    assert metrics["merged_rows"] == 3 and "behaviour_weight" in metrics
    torch.testing.assert_close(merged, alone, atol=1e-5, rtol=0)


def test_rows_that_differ_in_anything_the_loss_reads_are_not_merged():
    def nudge(batch):
        batch.old_logprobs_BT[1] = batch.old_logprobs_BT[1] * (1 + 1e-6)  # not bitwise the same as row 0
    _, metrics = _sgd_change(True, nudge)
    assert metrics["merged_rows"] == 2
    # an entropy bonus or a KL term in the loss: rows are no longer their policy loss alone
    for settings in (dict(entropy_coef=0.01), dict(kl_coef=0.1)):
        _, metrics = _sgd_change(True, **settings)
        assert metrics["merged_rows"] == 0, settings
