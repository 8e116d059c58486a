"""Each domain's measured share of the gradient norm (``Learner.grad_shares``): exact against the
learner's own step, and what ``domain_token_weights_B`` does to it for a domain whose
completions are 10x longer, on completions the miniature model sampled itself.

What the numbers show (16 groups of 4 per domain, 6 and 60 tokens, seeds 0-3): without the
weights the long domain holds 0.70-0.82 of the gradient norm (mean 0.79) for its 0.5 of the
rollouts; with them it holds 0.19-0.32 (mean 0.28), not 0.5. The weights make each domain's
share of the loss's weight its share of rollouts exactly (checked below), but a completion's
token gradients add up mostly incoherently here, so a domain's gradient norm grows as the
square root of its tokens (predicted shares: sqrt(10) / (1 + sqrt(10)) = 0.76 without the
weights, 1 / (1 + sqrt(10)) = 0.24 with them): the weights over-correct the gradient norm by
that square root.
"""

import copy
import math
import random

import pytest
import torch

from tempering.algorithms.advantages import grpo
from tempering.learner.step import Learner
from tempering.models.loading import load_model
from tempering.rollout.base import SamplingParams
from tempering.rollout.hf import HFGenerator
from tempering.scheduler import domain_token_weights_B
from tempering.train import make_batch
from tempering.types import Problem
from real_settings import run_settings

SHORT, LONG = 6, 60


def _learner(model) -> Learner:
    """SGD(lr=1), no clipping: a step's parameter change is minus its gradient."""
    return Learner(model, torch.optim.SGD(model.parameters(), lr=1.0), lambda step: 1.0, run_settings(grad_clip=0.0))


def _sampled_groups(model, tokenizer, seed: int) -> list:
    """16 groups of 4 per domain, sampled by the model at temperature 1 with its end token
    barred, so every completion is as long as its domain's limit; rewards 1, 0, 1, 0."""
    generator, rng, draw = HFGenerator(model, tokenizer), torch.Generator().manual_seed(seed), random.Random(seed)
    groups = []
    for task, length in (("short", SHORT), ("long", LONG)):
        problems = [Problem(task=task, id=str(i), prompt=f"{draw.randint(10, 99)}+{draw.randint(10, 99)}\n", answer="")
                    for i in range(16)]
        params = SamplingParams(max_new_tokens=length, logit_bias=((tokenizer.eos_token_id, -100.0),))
        groups += generator.generate(problems, 4, params, 0, rng)
    for group in groups:
        for k, rollout in enumerate(group.rollouts):
            rollout.reward = float(k % 2 == 0)
    return groups


def _domains_B(groups) -> list[str]:
    return [g.problem.task for g in groups for _ in g.rollouts]


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    model, tokenizer = load_model(str(tiny_model_dir))[:2]
    return model, tokenizer


def test_the_shares_are_the_norms_of_each_domains_part_of_the_steps_gradient(policy):
    model, tokenizer = policy
    groups = _sampled_groups(model, tokenizer, seed=0)
    batch = make_batch(groups, grpo, tokenizer.pad_token_id)
    batch.weights_B = domain_token_weights_B(groups)
    domains_B = _domains_B(groups)
    measured = copy.deepcopy(model)
    shares = _learner(measured).grad_shares(batch, domains_B)

    norms = {}
    for domain in ("short", "long"):  # the step's gradient with the other domain's advantages zeroed
        copied = copy.deepcopy(model)
        own = copy.copy(batch)
        keep_B = torch.tensor([d == domain for d in domains_B], dtype=torch.float32)
        own.advantages_BT = batch.advantages_BT * keep_B[:, None]
        before = [p.detach().clone() for p in copied.parameters()]
        _learner(copied).step(own)
        change = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, copied.parameters())])
        norms[domain] = float(change.norm())
    assert shares["domain/long/grad_share"] == pytest.approx(norms["long"] / (norms["short"] + norms["long"]), abs=1e-5)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert all(p.grad is None for p in measured.parameters()), "no gradient is left for the step to add to"


def test_token_weights_balance_the_loss_weight_and_over_correct_the_gradient_norm_of_long_completions(policy):
    model, tokenizer = policy
    off, on = [], []
    for seed in range(4):
        groups = _sampled_groups(model, tokenizer, seed)
        assert {len(r.completion_ids) for g in groups for r in g.rollouts} == {SHORT, LONG}
        batch = make_batch(groups, grpo, tokenizer.pad_token_id)
        learner = _learner(copy.deepcopy(model))
        off.append(learner.grad_shares(batch, _domains_B(groups))["domain/long/grad_share"])
        batch.weights_B = domain_token_weights_B(groups)
        on.append(learner.grad_shares(batch, _domains_B(groups))["domain/long/grad_share"])

        long_B = torch.tensor([d == "long" for d in _domains_B(groups)])
        weight_B = batch.weights_B * batch.loss_mask_BT.sum(dim=1)  # each row's weight in a token-mean loss
        assert float(weight_B[long_B].sum() / weight_B.sum()) == pytest.approx(0.5), "the drawn share of the loss"
    drawn, root = 0.5, math.sqrt(LONG / SHORT)
    assert min(off) > 0.6, f"without the weights the long domain dominates the gradient: {off}"
    assert max(on) < 0.4, f"with them it is pushed below its drawn share {drawn}: {on}"
    assert sum(off) / 4 == pytest.approx(root / (1 + root), abs=0.08)
    assert sum(on) / 4 == pytest.approx(1 / (1 + root), abs=0.08)


def test_fsdp_refuses_the_measure_it_cannot_take():
    from tempering.build import check_parallel, learner_settings, resolve_algorithm
    from tempering.config import ConfigError, load_config

    config = load_config(None, ["learner.parallel=fsdp", "learner.grad_share_every=5"])
    with pytest.raises(ConfigError, match="learner.parallel=fsdp: learner.grad_share_every needs the whole gradient"):
        check_parallel(config, learner_settings(config, resolve_algorithm(config), 0))
    check_parallel(load_config(None, ["learner.parallel=fsdp"]), learner_settings(config, resolve_algorithm(config), 0))
