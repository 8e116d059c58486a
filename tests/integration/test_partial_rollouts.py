"""Partial rollouts: new weights taking over in the middle of a generation, on the miniature model
(the built-in sampler, and ``temper serve`` reloaded between the chunks of its requests).

A round takes new weights at a fixed decoding step (the pipeline's ``partial_chunk``: the
sampler asks for updates between steps, and at that step the pipeline waits for the learner's
next version). The tokens drawn before it
must carry the old version and the old policy's log-probs, those after it the new version and
the new policy's log-probs given their whole prefix (what the learner computes), and the
learner's correction must weigh each token by its own log-prob: against the new weights, the
tokens after the update weigh exactly 1 and those before ``pi_new / pi_old``.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tempering.algorithms.correction import correct
from tempering.build import check_partial_rollouts
from tempering.config import ConfigError, TrainConfig
from tempering.learner.forward import token_logprobs
from tempering.learner.step import collate
from tempering.pipeline import Pipeline, RewardWorker, RolloutWorker
from tempering.versions import staleness_record
from tempering.rollout.base import SamplingParams
from tempering.rollout.hf import HFGenerator
from tempering.types import Group, Problem

PROMPTS = ["7+8\n", "47+38\n", "123+456\n"]
SWITCH_STEP = 3
"""The decoding step from which the new weights draw (the pipeline's ``partial_chunk``)."""
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=10, ignore_eos=True)


class Problems:
    """A mixture that always draws the same problems (the scheduler is not what this tests)."""

    paused: dict = {}

    def next_problems(self, count):
        return [Problem(task="add", id=str(i), prompt=p, answer="0") for i, p in enumerate(PROMPTS[:count])]

    def observe(self, groups):
        pass

    def observe_sampling(self, seconds):
        pass

    def due_probes(self, now):
        return []


class Unscored:
    """Rewards that keep every rollout and score none (rewards are not what this tests)."""

    def score(self, groups):
        return {}

    def close(self):
        pass


def _new_policy(model):
    """The miniature model with every weight moved by seeded noise: the learner's next version."""
    moved = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.3 * p.std().nan_to_num() * torch.randn(p.shape, generator=gen))
    return moved


def _partial_round(tiny_policy, generator) -> tuple[list[Group], Pipeline, torch.nn.Module]:
    """The second round of an async run with partial rollouts, in which new weights take over
    after ``SWITCH_STEP`` decoding steps: the learner takes the first round (version 0) and
    publishes version 1, which the second round waits for after its chunk of ``SWITCH_STEP``
    tokens. Returns the round's groups, the pipeline and the new model."""
    model, _ = tiny_policy
    new = _new_policy(model)
    worker = RolloutWorker(generator, PARAMS, group_size=4, seed=3)
    pipeline = Pipeline(Problems(), worker, RewardWorker(Unscored()), prompts=3, mode="async", partial_rollouts=True,
                        partial_chunk=SWITCH_STEP)
    pipeline.publish(model, 0)
    pipeline.start()
    first = pipeline.next_round()
    assert all(set(r.token_versions) == {0} for g in first.groups for r in g.rollouts), "nothing to swap to yet"
    pipeline.publish(new, 1)
    made = pipeline.next_round()
    pipeline.close()
    return made.groups, pipeline, new


def _logprobs(model, rollouts, pad_id):
    batch = collate(rollouts, pad_id)
    with torch.no_grad():
        logprobs_BT, _ = token_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT)
    return batch, logprobs_BT * batch.loss_mask_BT


def _assert_each_token_has_its_policys_logprob(model, new, pad_id: int, rollouts) -> None:
    """The tokens of version 0 carry the old policy's log-probs, those of version 1 the new
    policy's given their whole prefix (what the learner computes), to 1e-4."""
    batch, old_BT = _logprobs(model, rollouts, pad_id)
    _, new_BT = _logprobs(new, rollouts, pad_id)
    versions_BT = torch.zeros_like(batch.loss_mask_BT)
    for row, r in enumerate(rollouts):
        versions_BT[row, len(r.prompt_ids) : len(r.prompt_ids) + len(r.completion_ids)] = torch.tensor(r.versions) + 1
    before_BT, after_BT = (versions_BT == 1).float(), (versions_BT == 2).float()
    sampled_BT = batch.old_logprobs_BT
    assert float(((sampled_BT - old_BT) * before_BT).abs().max()) < 1e-4
    assert float(((sampled_BT - new_BT) * after_BT).abs().max()) < 1e-4
    # the update matters: kept old keys and values, or the old policy, would be far from these
    assert float(((new_BT - old_BT) * after_BT).abs().max()) > 0.05


@pytest.mark.parametrize("fast", [True, False], ids=["fast_decoder", "transformers"])
def test_tokens_after_an_update_carry_the_new_version_and_the_new_policys_logprobs(tiny_policy, fast):
    model, tokenizer = tiny_policy
    groups, pipeline, new = _partial_round(tiny_policy, HFGenerator(copy.deepcopy(model), tokenizer, fast=fast))
    rollouts = [r for g in groups for r in g.rollouts]
    assert pipeline.counters.weight_syncs == 2, "version 0 at the start, version 1 in the second round"
    assert all(r.policy_version == 0 for r in rollouts), "a rollout's version is its oldest token's"
    assert all(r.token_versions == [0] * SWITCH_STEP + [1] * (10 - SWITCH_STEP) for r in rollouts)
    _assert_each_token_has_its_policys_logprob(model, new, tokenizer.pad_token_id, rollouts)

    record = staleness_record(groups, 1, 1)
    assert record["staleness/mean"] == 1 and record["staleness/token_mean"] == pytest.approx(SWITCH_STEP / 10)


def test_a_server_is_reloaded_between_the_chunks_of_its_requests(tiny_policy, tiny_model_dir, tempering_cache,
                                                                 tmp_path):
    """The same round against ``temper serve``: its requests ask for ``SWITCH_STEP`` tokens, the
    server is reloaded with version 1, and the unfinished completions go on from their tokens
    so far under it (a server stops at end-of-sequence: completions may be shorter)."""
    from serving import serving

    from tempering.rollout.remote import ServerGenerator, ServerSettings

    model, tokenizer = tiny_policy
    with serving(tiny_model_dir, tempering_cache) as url:
        generator = ServerGenerator(ServerSettings(url=url, weights_dir=str(tmp_path / "w")), tokenizer, model.config)
        try:
            groups, pipeline, new = _partial_round(tiny_policy, generator)
        finally:
            generator.close()
    rollouts = [r for g in groups for r in g.rollouts]
    assert pipeline.counters.weight_syncs == 2, "version 0 at the start, version 1 in the second round"
    assert sum(len(r.completion_ids) > SWITCH_STEP for r in rollouts) >= 6, "completions went on after the reload"
    assert all(r.token_versions == [0] * min(SWITCH_STEP, len(r.completion_ids))
               + [1] * (len(r.completion_ids) - SWITCH_STEP) for r in rollouts)
    _assert_each_token_has_its_policys_logprob(model, new, tokenizer.pad_token_id, rollouts)


def test_the_correction_weighs_each_token_by_its_own_logprob(tiny_policy):
    """Against the new weights (the proximal policy of the learner at version 1), the tokens the
    new weights drew weigh 1 and the older ones ``pi_new / pi_old``: a correction that took the
    old policy's log-probs for every token (the rollout's first version) weighs the newer ones
    away from 1 and fails here."""
    model, tokenizer = tiny_policy
    groups, _, new = _partial_round(tiny_policy, HFGenerator(copy.deepcopy(model), tokenizer, fast=True))
    rollouts = [r for g in groups for r in g.rollouts]
    batch, prox_BT = _logprobs(new, rollouts, tokenizer.pad_token_id)
    _, old_BT = _logprobs(model, rollouts, tokenizer.pad_token_id)
    weight_BT, _ = correct("tis", prox_BT, batch.old_logprobs_BT, batch.loss_mask_BT, 0.0, 100.0)
    after_BT = torch.zeros_like(batch.loss_mask_BT)
    for row, r in enumerate(rollouts):
        after_BT[row, len(r.prompt_ids) + SWITCH_STEP : len(r.prompt_ids) + len(r.completion_ids)] = 1
    before_BT = batch.loss_mask_BT - after_BT
    assert float(((weight_BT - 1) * after_BT).abs().max()) < 1e-3
    expected_BT = torch.exp(prox_BT - old_BT) * before_BT
    assert float(((weight_BT - expected_BT) * before_BT).abs().max()) < 1e-3
    assert float(((weight_BT - 1) * before_BT).abs().max()) > 0.05, "the older tokens are corrected"


def test_a_forced_update_gives_the_same_rollouts_twice(tiny_policy):
    model, tokenizer = tiny_policy
    first, second = (_partial_round(tiny_policy, HFGenerator(copy.deepcopy(model), tokenizer, fast=True))[0]
                     for _ in range(2))
    assert [(r.completion_ids, r.logprobs, r.versions) for g in first for r in g.rollouts] == \
        [(r.completion_ids, r.logprobs, r.versions) for g in second for r in g.rollouts]


@pytest.mark.parametrize("overrides, field", [
    ({"mode": "sync"}, "mode=sync"),
    ({"mode": "async", "backend": "ray"}, "backend=ray"),
])
def test_partial_rollouts_outside_async_in_this_process_are_refused(overrides, field):
    config = TrainConfig.model_validate({"pipeline": {"partial_rollouts": True, **overrides}})
    with pytest.raises(ConfigError, match=f"pipeline.partial_rollouts.*{field}"):
        check_partial_rollouts(config)


@pytest.mark.slow
def test_an_async_run_with_partial_rollouts_trains_and_resumes(tmp_path: Path, tiny_model_dir: Path):
    """A short real run, SIGKILLed inside a learner step and resumed: every step is logged once,
    every rollout sampled is accounted for, and no token is older than its rollout (slow: two
    runs of the CLI, about 30 s of CPU)."""
    run = tmp_path / "run"
    args = ["steps=6", "threads=1", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=24",
            "eval.problems_per_task=2", "eval.max_new_tokens=8",
            "checkpoint.every=1", f"model.path={tiny_model_dir}", "pipeline.mode=async",
            "pipeline.partial_rollouts=true"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TEMPERING_KILL_AT": "learn:3"}
    base = [sys.executable, "-m", "tempering.cli", "train", "--quiet"]
    killed = subprocess.run([*base, *args, "--run-dir", str(run)], env=env, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr[-2000:]
    env.pop("TEMPERING_KILL_AT")
    resumed = subprocess.run([*base, "--resume", str(run)], env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 7))
    assert all(r["staleness/token_mean"] <= r["staleness/mean"] for r in records)
    counts = json.loads((run / "summary.json").read_text())["rollouts"]
    assert counts["sampled"] == counts["taken"] + counts["dropped_stale"] + counts["left_in_buffer"], counts
