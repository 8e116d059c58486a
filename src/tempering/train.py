"""``temper train``: the RL loop, top to bottom.

build the run (``tempering.build``: model, tasks, rewards, scheduler, learner, pipeline) ->
evaluate -> repeat {take scored rounds -> shape rewards -> advantages -> learner step ->
publish weights -> log -> checkpoint} -> evaluate -> save. Everything else is a function or
object this file calls; reading this file should be enough to know what a step does.

Where rollouts come from (synchronously or ahead of the learner, in this process or on Ray
actors) is ``tempering.pipeline``'s; checkpoints and resume are ``tempering.checkpoint``'s,
called from here every ``checkpoint.every`` steps, and when the rewards keep failing (a
grader outage past ``rewards.max_outage_rounds``: the run stops with a checkpoint and a
message saying how to continue; one domain's grader down while others score pauses that
domain and the run goes on, ``scheduler.pause_failing``). Adaptive mixtures are
``tempering.scheduler``'s: the pipeline shows it every sampled group (and the seconds
sampling took, for what a rollout of each domain costs) and the loop closes each step; every
``learner.grad_share_every`` steps the learner measures each domain's share of the gradient
norm before its update, and with ``learner.grad_balance_rate`` those shares move per-domain
loss multipliers towards each domain's drawn share. DAPO's dynamic sampling and overlong
shaping are in ``tempering.algorithms.dapo``.
Under ``torchrun`` this loop runs on rank 0; the other ranks only follow its learner
(``tempering.learner.parallel``).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import torch

from tempering import checkpoint
from tempering.algorithms import AdvantageInputs
from tempering.algorithms.advantages import AdvantageFn
from tempering.algorithms.dapo import collect_groups, mask_truncated, overlong_penalty
from tempering.build import Run, build_follower, build_run, uses_ray
from tempering.config import AlgorithmConfig, ConfigError, TrainConfig
from tempering.eval.sampled import greedy_by_round
from tempering.faults import TrainingDiverged, WorkerLost
from tempering.learner.parallel import follow
from tempering.learner.step import Learner, collate
from tempering.pipeline import GraderOutage
from tempering.policy import saves_merged
from tempering.reporting.live import LiveView
from tempering.reporting.metrics import before_after_table, by_round_table, components_table
from tempering.reporting.samples import SampleWriter
from tempering.reporting.sinks import StepLog
from tempering.scheduler import balance_grad_weights, cap_domain_tokens, domain_token_weights_B
from tempering.types import Batch, Group
from tempering.versions import staleness_record


def shape_overlong(groups: list[Group], ac: AlgorithmConfig, max_new_tokens: int) -> dict[str, float]:
    """DAPO's overlong shaping, as configured: the soft penalty on rewards, then the filter.

    Runs after dynamic sampling, which therefore judges groups on their task rewards. A
    multi-turn episode is judged by its longest model turn (``max_new_tokens`` bounds a turn).
    """
    rollouts = [r for g in groups for r in g.rollouts]
    penalty = 0.0
    for rollout in rollouts:
        length = max((t.end - t.start for t in rollout.turns), default=len(rollout.completion_ids))
        shift = overlong_penalty(length, max_new_tokens, ac.overlong_buffer, ac.overlong_penalty)
        rollout.reward += shift
        penalty -= shift
    truncated = sum(r.finish_reason == "length" for r in rollouts)
    if ac.overlong_filter:
        mask_truncated(rollouts)
    return {"truncated_fraction": truncated / len(rollouts), "overlong_penalty": penalty / len(rollouts)}


def make_batch(groups: list[Group], estimator: AdvantageFn, pad_id: int, learner: Learner | None = None,
               gamma: float = 1.0, lam: float = 1.0, task_weight: float = 0.0) -> Batch:
    """The learner's batch with advantages; the learner (when given) supplies the critic's
    values, a KL penalty folded into the reward and a teacher's log-probs, where configured."""
    rollouts = [r for g in groups for r in g.rollouts]
    batch = collate(rollouts, pad_id)
    group_B = torch.tensor([i for i, g in enumerate(groups) for _ in g.rollouts])
    batch.group_B = group_B
    rewards_B = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
    values_BT = learner.values(batch) if learner is not None else None
    penalty_BT = learner.reward_penalty(batch) if learner is not None else None
    teacher_BT = learner.teacher_logprobs(batch) if learner is not None else None
    domains = {d: i for i, d in enumerate(dict.fromkeys(r.problem.domain_key for r in rollouts))}
    domain_B = torch.tensor([domains[r.problem.domain_key] for r in rollouts])
    batch.advantages_BT = estimator(AdvantageInputs(
        rewards_B, group_B, batch.loss_mask_BT, values_BT, penalty_BT, gamma=gamma, lam=lam, domain_B=domain_B,
        logprobs_BT=batch.old_logprobs_BT, teacher_logprobs_BT=teacher_BT, task_weight=task_weight))
    if values_BT is not None:
        batch.values_BT, batch.returns_BT = values_BT, (batch.advantages_BT + values_BT) * batch.loss_mask_BT
    return batch


TIMING_KEYS = frozenset({"generate_s", "reward_s", "learn_s", "step_s", "generate_tok_s", "train_tok_s",
                         "weight_sync_s", "wait_s", "checkpoint_s", "grad_share_s", "eval_s", "scheduler/s_per_token"})
"""Record keys that measure wall-clock time: with :data:`TIMING_SUFFIXES`, the only ones a resumed
run may not repeat exactly."""

TIMING_SUFFIXES = ("/cost_s", "/reward_time_share")
"""Ends of per-domain record keys that measure wall-clock time (the mixture's costs)."""


def is_timing(key: str) -> bool:
    """Whether a step record's ``key`` measures wall-clock time (see :data:`TIMING_KEYS`)."""
    return key in TIMING_KEYS or key.endswith(TIMING_SUFFIXES)


def train(config: TrainConfig, progress: bool = True, resume: bool = False) -> dict:
    """Run RL training as configured; return the summary also written to ``summary.json``.

    With ``resume``, ``config.run_dir`` is an existing run: it continues from its newest
    complete checkpoint (or from the start when there is none) and ends exactly where an
    uninterrupted synchronous run would.
    """
    start = time.perf_counter()
    if int(os.environ.get("RANK", "0")) > 0:  # a learner process torchrun started beside the leader
        learner = build_follower(config)
        try:
            follow(learner)
        finally:
            learner.parallel.close()
        return {}
    run = build_run(config, progress, resume)
    first_step, eval_before, timings = 0, None, {"generate_s": 0.0, "reward_s": 0.0, "learn_s": 0.0}
    state = run.folder.start(config, lambda found: restore(found, run))
    if state is not None:
        first_step, eval_before, timings = state["step"], state["eval_before"], state["timings"]
    if eval_before is None:
        eval_before = run.evaluate()

    metrics = StepLog(run.run_dir, config.logging.sinks, resume, config.model_dump(mode="json"))
    samples = SampleWriter(run.run_dir / "samples.jsonl", config.logging.samples, config.seed)
    view = LiveView(config.steps, first_step, config.logging.table_every, progress)
    if run.precision is not None:
        view.note(f"precision: learner and sampler in {run.precision.describe()}")
    nonfinite_streak = 0
    checkpoint_s = None
    run.pipeline.publish(run.model, run.learner.version)
    run.pipeline.start()
    try:
        for step in range(first_step, config.steps):
            try:
                groups, record = learn_step(run)
            except GraderOutage as outage:
                raise stop_for_outage(run, step, eval_before, timings, outage) from None
            except WorkerLost as lost:
                raise WorkerLost(f"{lost}\nThe run stopped in step {step + 1}; once the cluster offers what it "
                                 f"needs again, continue from its last checkpoint with "
                                 f"`temper train --resume {run.run_dir}`") from None
            record["step"] = step + 1
            for key in timings:
                timings[key] += record[key]
            if config.eval.every and (step + 1) % config.eval.every == 0 and step + 1 < config.steps:
                t_eval = time.perf_counter()
                record.update(eval_record(run.evaluate()), eval_s=time.perf_counter() - t_eval)
            record.update(run.monitors.update(groups, record), **run.threads.update())
            with run.pipeline.scheduler_lock():
                record.update(run.mixture.update(), **run.mixture.pause_record())
            record.update(run.pipeline.domain_record())
            nonfinite_streak = nonfinite_streak + 1 if record["skipped_updates"] else 0
            if nonfinite_streak >= config.checkpoint.rollback_after:
                record["rollback_to"] = rollback(run)
                nonfinite_streak = 0
            if checkpoint_s is not None:
                record["checkpoint_s"], checkpoint_s = checkpoint_s, None  # the previous step's save
            metrics.write(record)  # before the checkpoint: a resumed run never lacks a step's record
            samples.write(step + 1, groups)
            every = config.checkpoint.every
            stopping = run.monitors.stopping  # a monitor whose action is stop alerted this step
            if stopping or (every and ((step + 1) % every == 0 or step + 1 == config.steps)):
                t0 = time.perf_counter()
                save_checkpoint(run, step + 1, eval_before, timings)
                checkpoint_s = time.perf_counter() - t0
            view.update(record)
            if stopping:
                raise ConfigError(f"{stopping}\nThe checkpoint of step {step + 1} is saved: fix the reward, or change "
                                  f"rewards.monitors.actions in {run.run_dir / 'config.yaml'}, then continue with "
                                  f"`temper train --resume {run.run_dir}`")
    finally:
        view.close()
        metrics.close()
        samples.close()
        run.close()

    eval_after = run.evaluate()
    final = run.run_dir / checkpoint.FINAL_MODEL
    checkpoint.save_model(run.model, run.tokenizer, final, saves_merged(config))
    counters = run.pipeline.counters
    summary = {
        "eval_before": eval_before, "eval_after": eval_after, "steps": config.steps,
        "wall_s": time.perf_counter() - start, "model": run.model_path, "checkpoint": str(final),
        "seconds_per_step": {k: v / max(config.steps, 1) for k, v in timings.items()},
        "resumed_from": first_step if resume else None,
        "precision": None if run.precision is None else run.precision.describe(),
        "rollouts": {"sampled": counters.rollouts_sampled, "taken": counters.rollouts_taken,
                     "dropped_stale": counters.dropped_stale, "dropped_stale_tokens": counters.dropped_stale_tokens,
                     "left_in_buffer": run.pipeline.buffered,
                     "worker_restarts": run.pipeline.restarts, "by_domain": run.pipeline.domain_counts()},
    }
    if uses_ray(config):
        summary["ray_nodes"] = run.ray_nodes()
    if by_round := greedy_by_rounds(config, eval_before, eval_after):
        summary["greedy_by_round"] = by_round
    run.folder.finish(summary)
    if run.learner.parallel is not None:
        run.learner.parallel.close()
    if progress:
        print(before_after_table(eval_before, eval_after))
        if eval_after.get("components"):
            print(components_table(eval_before, eval_after))
        if by_round:
            print(by_round_table(by_round["before"], by_round["after"]))
        print(run.mixture.table())
        print(f"run folder: {run.run_dir}  ({summary['wall_s']:.0f} s)")
    return summary


def eval_record(result: dict) -> dict[str, float]:
    """A held-out evaluation as step-record keys: ``eval/accuracy``, ``eval/<task>``,
    ``eval/<task>/len_<L>`` (accuracy at each length of a task with several),
    ``eval/<task>/<component>`` (the means its metric summarizes) and ``eval/grader_errors``;
    a task (or the whole) with no problem graded has no number."""
    record = {f"eval/{name}": value for name, value in result["per_task"].items() if value is not None}
    record.update({f"eval/{name}/len_{length}": value for name, curve in result.get("by_length", {}).items()
                   for length, value in curve.items() if value is not None})
    record.update({f"eval/{name}/{key}": value for name, means in result.get("components", {}).items()
                   for key, value in means.items()})
    if result["accuracy"] is not None:
        record["eval/accuracy"] = result["accuracy"]
    record["eval/grader_errors"] = sum(result["grader_errors"].values())
    record["eval/truncated"] = sum(result.get("truncated", {}).values())
    return record


def learn_step(run: Run) -> tuple[list[Group], dict]:
    """One RL step: scored rounds -> shaped rewards -> batch with advantages -> learner update
    -> new weights published. Returns the groups trained on and the step's record (rewards,
    learner metrics, timings)."""
    config, pipeline, learner, ac = run.config, run.pipeline, run.learner, run.config.algorithm
    t0 = time.perf_counter()
    groups, record = collect_groups(pipeline.next_round, config.rollout.prompts_per_step,
                                    ac.dynamic_sampling, ac.max_extra_rounds)
    if config.pipeline.mode == "async":
        record["wait_s"] = time.perf_counter() - t0
    record.update(shape_overlong(groups, ac, config.rollout.max_new_tokens))
    record.update(run.monitors.screen(groups))  # zero or stop: flagged rollouts' rewards to 0
    t1 = time.perf_counter()
    groups, record["capped_groups"] = cap_domain_tokens(groups, config.scheduler.max_domain_token_share)
    pipeline.settle(groups)  # what the step took and does not train on is dropped, per domain
    record.update(staleness_record(groups, learner.version, config.pipeline.max_staleness))
    batch = make_batch(groups, run.algorithm["advantage"], run.tokenizer.pad_token_id, learner, ac.gamma, ac.lam,
                       ac.teacher.task_weight)
    if config.scheduler.balance_tokens:
        batch.weights_B = domain_token_weights_B(groups)
    tasks_B = [g.problem.task for g in groups for _ in g.rollouts]
    rate = config.learner.grad_balance_rate
    if rate:
        record.update(apply_grad_weights(batch, tasks_B, run.mixture.grad_weights))
    every = config.learner.grad_share_every or (1 if rate else 0)
    if every and learner.version % every == 0:  # the shares of the gradient this update follows
        t_share = time.perf_counter()
        shares = learner.grad_shares(batch, tasks_B)
        record.update(shares)
        record["grad_share_s"] = time.perf_counter() - t_share
        if rate:  # for the next steps: this one follows the multipliers its shares were measured with
            run.mixture.grad_weights = rebalanced(run.mixture.grad_weights, shares, tasks_B, rate)
    record.update(learner.step(batch))
    record["weight_sync_s"] += pipeline.publish(run.model, learner.version)
    t2 = time.perf_counter()
    train_tokens = int(batch.attention_mask_BT.sum())
    counters = pipeline.counters
    record.update(policy_version=learner.version, learn_s=t2 - t1, step_s=t2 - t0,
                  train_tokens=train_tokens, train_tok_s=train_tokens / (t2 - t1),
                  generate_tok_s=record["completion_tokens"] / max(record["generate_s"], 1e-9),
                  dropped_stale=counters.dropped_stale, rollouts_sampled=counters.rollouts_sampled,
                  rollouts_taken=counters.rollouts_taken, worker_restarts=pipeline.restarts,
                  outage_rounds=counters.outage_rounds)
    return groups, record


def apply_grad_weights(batch: Batch, tasks_B: list[str], grad_weights: dict[str, float]) -> dict[str, float]:
    """Multiply each row's weight by its task's gradient-balance multiplier
    (``learner.grad_balance_rate``); returns them as ``domain/<task>/grad_weight``."""
    factors = {t: grad_weights.get(t, 1.0) for t in dict.fromkeys(tasks_B)}
    factor_B = torch.tensor([factors[t] for t in tasks_B])
    batch.weights_B = factor_B if batch.weights_B is None else batch.weights_B * factor_B
    return {f"domain/{t}/grad_weight": w for t, w in factors.items()}


def rebalanced(grad_weights: dict[str, float], shares: dict[str, float], tasks_B: list[str],
               rate: float) -> dict[str, float]:
    """The multipliers after a step of :func:`balance_grad_weights` from ``shares`` (as
    ``Learner.grad_shares`` gives them) towards each task's share of the batch's rows."""
    drawn = Counter(tasks_B)
    return balance_grad_weights(grad_weights, {t: shares[f"domain/{t}/grad_share"] for t in drawn},
                                {t: n / len(tasks_B) for t, n in drawn.items()}, rate)


def greedy_by_rounds(config: TrainConfig, eval_before: dict, eval_after: dict) -> dict:
    """``{"before"|"after": {task: {"greedy[round<=r]": value}}}`` for the tasks played in an
    environment of more than one turn (empty when none is): what feedback turns add."""
    rounds = {spec.name: spec.env.max_turns for spec in config.tasks
              if spec.env is not None and spec.env.max_turns > 1 and spec.name in eval_after["per_task"]}
    if not rounds:
        return {}
    return {when: {name: {metric: entry["value"] for metric, entry in greedy_by_round(result, name, turns).items()}
                   for name, turns in rounds.items()}
            for when, result in (("before", eval_before), ("after", eval_after))}


def save_checkpoint(run: Run, step: int, eval_before: dict, timings: dict) -> None:
    """The run's whole state after ``step`` steps, taken with the pipeline paused (nothing in flight)."""
    run.pipeline.pause()
    try:
        state = {"step": step, "learner": run.learner.state_dict(), "mixture": run.mixture.state_dict(),
                 "pipeline": run.pipeline.state_dict(), "monitors": run.monitors.state_dict(),
                 "rng": checkpoint.rng_state(),
                 "eval_before": eval_before, "timings": dict(timings)}
        checkpoint.save(run.run_dir, step, run.model, run.tokenizer, state, run.config.checkpoint.keep,
                        saves_merged(run.config))
    finally:
        run.pipeline.resume()


def stop_for_outage(run: Run, step: int, eval_before: dict, timings: dict, outage: GraderOutage) -> ConfigError:
    """A grader that stayed down past the budget: save the run after ``step`` steps (the round
    it could not score is kept, to be sampled first on resume) and say what failed and how to
    go on. With dynamic sampling, rounds the stopped step had already kept are not saved (they
    are counted as dropped)."""
    run.pipeline.settle([])
    save_checkpoint(run, step, eval_before, timings)
    return ConfigError(f"{outage} (rewards.max_outage_rounds={run.config.rewards.max_outage_rounds}). The run "
                       f"stopped after step {step} with a checkpoint; once the grader answers again, continue "
                       f"with `temper train --resume {run.run_dir}`")


def restore(path: Path, run: Run) -> dict:
    """Load a checkpoint's whole state into the freshly built run; return the loop's part."""
    state = checkpoint.load_state(path)
    checkpoint.load_model_weights(run.model, path)
    run.learner.load_state_dict(state["learner"])
    try:  # a task whose stream the checkpoint cannot continue (another seed, a changed data file)
        run.mixture.load_state_dict(state["mixture"])
    except ValueError as exc:
        raise ConfigError(f"cannot resume from {path}: {exc}") from None
    run.pipeline.load_state_dict(state["pipeline"])
    run.monitors.load_state_dict(state["monitors"])
    checkpoint.restore_rng(state["rng"])
    return state


def rollback(run: Run) -> int:
    """Repeated non-finite steps: restore the last checkpoint's weights and optimizer, keep the
    data moving forward (so the same batches are not replayed); return the step restored."""
    found = checkpoint.usable(run.run_dir)
    if found is None:
        raise TrainingDiverged("training diverged: repeated non-finite losses or gradients, and no checkpoint "
                               "to roll back to (set checkpoint.every)")
    state = checkpoint.load_state(found)
    checkpoint.load_model_weights(run.model, found)
    state["learner"]["version"] = run.learner.version  # versions only grow: rollouts stay comparable
    run.learner.load_state_dict(state["learner"])
    return state["step"]
