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

Balancing the gradient itself (``learner.grad_balance_rate``, multipliers from the measured
shares): at rate 0.5, 10 balancing steps on fresh batches of a fixed policy, seeds 0-7, the
long domain holds 0.44-0.52 of the gradient norm over the last 6 steps (mean per seed; single
steps 0.32-0.66, for batches vary); with the multipliers off it holds 0.21-0.31.
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
from tempering.train import apply_grad_weights, make_batch, rebalanced
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


def _balanced_long_shares(model, tokenizer, seed: int, rate: float, steps: int = 10) -> list[float]:
    """The long domain's measured share on each of ``steps`` fresh batches (token weights on),
    each under the multipliers the previous ones' shares moved, as the loop does it."""
    learner, grad_weights, long_shares = _learner(copy.deepcopy(model)), {}, []
    for step in range(steps):
        groups = _sampled_groups(model, tokenizer, 100 * seed + step)
        batch = make_batch(groups, grpo, tokenizer.pad_token_id)
        batch.weights_B = domain_token_weights_B(groups)
        applied = apply_grad_weights(batch, _domains_B(groups), grad_weights)
        assert applied == {f"domain/{d}/grad_weight": grad_weights.get(d, 1.0) for d in ("short", "long")}
        shares = learner.grad_shares(batch, _domains_B(groups))
        long_shares.append(shares["domain/long/grad_share"])
        if rate:
            grad_weights = rebalanced(grad_weights, shares, _domains_B(groups), rate)
    return long_shares


def test_grad_balance_brings_a_domain_of_long_completions_back_to_its_drawn_share(policy):
    model, tokenizer = policy
    drawn, last = 0.5, 6
    for rate, near in ((0.5, True), (0.0, False)):
        means = [sum(shares[-last:]) / last for shares in (_balanced_long_shares(model, tokenizer, seed, rate)
                                                           for seed in range(4))]
        pooled = sum(means) / len(means)
        assert (abs(pooled - drawn) < 0.1) == near, f"rate {rate}: the long domain's share {pooled} ({means})"
        if near:
            assert min(means) > drawn - 0.15, means


def test_grad_weights_survive_a_checkpoint_of_the_mixture():
    import io

    from tempering.build import build_mixture, build_tasks
    from tempering.config import load_config

    config = load_config(None, ["learner.grad_balance_rate=0.5", 'tasks=[{"name": "add"}, {"name": "sub"}]'])
    saved, restored = (build_mixture(config, build_tasks(config)) for _ in range(2))
    saved.grad_weights = {"add": 0.37, "sub": 1.63}
    buffer = io.BytesIO()  # through bytes, as a checkpoint does
    torch.save(saved.state_dict(), buffer)
    buffer.seek(0)
    restored.load_state_dict(torch.load(buffer, weights_only=False))
    assert restored.grad_weights == saved.grad_weights
    state = saved.state_dict()
    del state["grad_weights"]  # a checkpoint from before balancing: every multiplier is 1
    restored.load_state_dict(state)
    assert restored.grad_weights == {}


def test_the_multiplier_update_moves_towards_the_drawn_share_at_the_rate():
    from tempering.scheduler import GRAD_WEIGHT_BOUND, balance_grad_weights

    drawn = {"a": 0.25, "b": 0.75}
    full = balance_grad_weights({}, {"a": 0.5, "b": 0.5}, drawn, 1.0)
    assert full["a"] / full["b"] == pytest.approx((0.25 / 0.5) / (0.75 / 0.5))
    assert 0.25 * full["a"] + 0.75 * full["b"] == pytest.approx(1.0), "the step's size is kept"
    half = balance_grad_weights({}, {"a": 0.5, "b": 0.5}, drawn, 0.5)
    assert half["a"] / half["b"] == pytest.approx(math.sqrt(full["a"] / full["b"]))
    # a domain's gradient is linear in its multiplier: at rate 1 the shares it then gives are the drawn ones
    norms = {"a": 0.5 * full["a"], "b": 0.5 * full["b"]}
    assert norms["a"] / (norms["a"] + norms["b"]) == pytest.approx(0.25)
    kept = balance_grad_weights({"a": 2.0, "c": 3.0}, {"a": 0.0, "b": 1.0}, {"a": 0.5, "b": 0.5}, 1.0)
    assert kept == {"a": 2.0, "b": 1.0, "c": 3.0}, "no gradient, nothing to move; unmeasured domains keep theirs"
    bounded = balance_grad_weights({"a": 50.0}, {"a": 1e-9, "b": 1.0}, {"a": 0.5, "b": 0.5}, 1.0)
    assert bounded["b"] == 1 / GRAD_WEIGHT_BOUND and bounded["a"] <= GRAD_WEIGHT_BOUND


def test_grad_balance_is_refused_with_one_task_and_under_fsdp():
    from tempering.build import check_grad_balance, check_parallel, learner_settings, resolve_algorithm
    from tempering.config import ConfigError, load_config

    one = load_config(None, ["learner.grad_balance_rate=0.5", 'tasks=[{"name": "add"}]'])
    with pytest.raises(ConfigError, match="learner.grad_balance_rate=0.5 balances the gradient between tasks"):
        check_grad_balance(one)
    check_grad_balance(load_config(None, ["learner.grad_balance_rate=0.5"]))
    config = load_config(None, ["learner.parallel=fsdp", "learner.grad_balance_rate=0.5"])
    with pytest.raises(ConfigError, match="learner.parallel=fsdp: learner.grad_balance_rate measures the whole"):
        check_parallel(config, learner_settings(config, resolve_algorithm(config), 0))


def test_fsdp_refuses_the_measure_it_cannot_take():
    from tempering.build import check_parallel, learner_settings, resolve_algorithm
    from tempering.config import ConfigError, load_config

    config = load_config(None, ["learner.parallel=fsdp", "learner.grad_share_every=5"])
    with pytest.raises(ConfigError, match="learner.parallel=fsdp: learner.grad_share_every needs the whole gradient"):
        check_parallel(config, learner_settings(config, resolve_algorithm(config), 0))
    check_parallel(load_config(None, ["learner.parallel=fsdp"]), learner_settings(config, resolve_algorithm(config), 0))
