"""``temper train``: the RL loop, top to bottom.

build (model, tasks, sampler, learner) -> evaluate -> repeat {sample groups -> reward ->
advantages -> learner step -> log} -> evaluate -> save. Everything else is a function or
object this file calls; reading this file should be enough to know what a step does.

Where rollouts come from (synchronously or ahead of the learner, in this process or on Ray
actors) is ``tempering.pipeline``'s; checkpoints and resume are ``tempering.checkpoint``'s,
called from here every ``checkpoint.every`` steps. Adaptive mixtures are
``tempering.scheduler``'s: the loop shows it every sampled group and closes each step.
DAPO's dynamic sampling and overlong shaping are in ``tempering.algorithms.dapo``.
"""

from __future__ import annotations

import copy
import json
import os
import random
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from tempering import checkpoint
from tempering.algorithms import ADVANTAGES, AGGREGATIONS, LOSSES, AdvantageInputs
from tempering.algorithms.advantages import AdvantageFn, needs_values
from tempering.algorithms.dapo import collect_groups, mask_truncated, overlong_penalty
from tempering.algorithms.logprobs import output_weight
from tempering.config import AlgorithmConfig, ConfigError, TrainConfig, save_resolved
from tempering.faults import TrainingDiverged
from tempering.evaluate import evaluate
from tempering.learner import Learner, LearnerSettings, collate, lr_factor
from tempering.models.loading import load_policy
from tempering.packing import tokens_for_memory
from tempering.pipeline import LocalHandle, Pipeline, RayHandle, RewardWorker, RolloutWorker, sampling_params
from tempering.reporting import MetricsWriter, before_after_table, truncate_metrics
from tempering.rewards import MonitorSettings, NormalizeSettings, RewardMonitors, Rewarder, resolve_reward
from tempering.rollout.hf import HFGenerator
from tempering.scheduler import Mixture, Settings, cap_domain_tokens, domain_token_weights_B
from tempering.tasks import Task, build_task
from tempering.threads import ThreadGovernor, auto_threads
from tempering.registry import resolve
from tempering.types import Batch, Group


def make_run_dir(run_dir: str | None) -> Path:
    path = Path(run_dir) if run_dir else Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_tasks(config: TrainConfig) -> list[Task]:
    """The configured tasks; a bad name, option or reward is a ConfigError naming the entry."""
    tasks = []
    for i, spec in enumerate(config.tasks):
        try:
            task = build_task(spec.name, seed=config.seed, **spec.options)
            if spec.rewards is not None:
                task.rewards = dict(spec.rewards)
            for reward in task.rewards:
                resolve_reward(reward)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"tasks.{i} ({spec.name}): {exc}") from None
        tasks.append(task)
    if len({t.name for t in tasks}) != len(tasks):
        raise ConfigError("tasks: each task may appear once; give repeated ones distinct names")
    return tasks


def resolve_algorithm(config: TrainConfig) -> dict:
    """The configured advantage estimator, loss and aggregation, or a ConfigError naming the key.

    Also refuses settings that are valid alone but not together.
    """
    found = {}
    ac = config.algorithm
    for key, registry in (("advantage", ADVANTAGES), ("loss", LOSSES), ("aggregation", AGGREGATIONS)):
        try:
            found[key] = resolve(registry, getattr(ac, key), key)
        except ValueError as exc:
            raise ConfigError(f"algorithm.{key}: {exc}") from None
    if ac.overlong_buffer > config.rollout.max_new_tokens:
        raise ConfigError(f"algorithm.overlong_buffer={ac.overlong_buffer}: must not exceed "
                          f"rollout.max_new_tokens={config.rollout.max_new_tokens}")
    if ac.kl_target > 0 and ac.kl_coef == 0:
        raise ConfigError("algorithm.kl_target: an adaptive KL coefficient needs a starting algorithm.kl_coef > 0")
    return found


def learner_token_budget(model, config: TrainConfig, critic: bool) -> int:
    """``learner.token_budget``, or the one ``learner.memory_budget_gb`` allows (0 when neither is set)."""
    lc, ac = config.learner, config.algorithm
    if lc.token_budget or not lc.memory_budget_gb:
        return lc.token_budget
    frozen = int(ac.kl_coef > 0) + int(critic and ac.critic == "model")
    try:
        tokens = tokens_for_memory(lc.memory_budget_gb, model, lc.gradient_checkpointing, lc.logprob_chunk, frozen)
    except ValueError as exc:
        raise ConfigError(f"learner.memory_budget_gb={lc.memory_budget_gb}: {exc}") from None
    return max(1, tokens)


def adamw(model, lr: float, betas: tuple[float, float], weight_decay: float) -> torch.optim.AdamW:
    """AdamW over the model's parameters, as one fused kernel where torch has it for their device
    (CPU and CUDA: the same update, several times faster than the per-tensor loop on a small model)."""
    parameters = list(model.parameters())
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in parameters)
    return torch.optim.AdamW(parameters, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused or None)


def build_learner(model, config: TrainConfig, algorithm: dict) -> Learner:
    lc, ac = config.learner, config.algorithm
    critic = needs_values(algorithm["advantage"])
    optimizer = adamw(model, lc.lr, lc.betas, lc.weight_decay)
    settings = LearnerSettings(
        loss=algorithm["loss"], aggregation=algorithm["aggregation"],
        clip_low=ac.clip_low, clip_high=ac.clip_high, dual_clip=ac.dual_clip, entropy_coef=ac.entropy_coef,
        kl_coef=ac.kl_coef, kl_estimator=ac.kl_estimator, kl_in_reward=ac.kl_in_reward,
        kl_target=ac.kl_target, kl_horizon=ac.kl_horizon,
        critic=ac.critic if critic else None,
        value_coef=ac.value_coef, value_clip=ac.value_clip,
        norm_length=ac.norm_length or config.rollout.max_new_tokens,
        ppo_epochs=lc.ppo_epochs, mini_batches=lc.mini_batches,
        temperature=config.rollout.temperature, micro_batch_size=lc.micro_batch_size,
        token_budget=learner_token_budget(model, config, critic), packing=lc.packing,
        logprob_chunk=lc.logprob_chunk, gradient_checkpointing=lc.gradient_checkpointing,
        grad_clip=lc.grad_clip, bf16=lc.bf16, off_policy=config.pipeline.off_policy, is_cap=config.pipeline.is_cap,
        skip_zero_advantage=lc.skip_zero_advantage, share_prompts=lc.share_prompts,
        merge_duplicates=lc.merge_duplicates,
    )
    if lc.logprob_chunk:
        try:
            output_weight(model)
        except ValueError as exc:
            raise ConfigError(f"learner.logprob_chunk={lc.logprob_chunk}: {exc}") from None
    schedule = lambda step: lr_factor(step, lc.warmup_steps, config.steps, lc.schedule, lc.min_lr_ratio)  # noqa: E731
    return Learner(model, optimizer, schedule, settings)


def build_rewarder(config: TrainConfig, tasks: list[Task]) -> Rewarder:
    """The tasks' rewards with their options and normalization; a bad option is a ConfigError."""
    rc = config.rewards
    try:
        return Rewarder(tasks, rc.options,
                        {name: NormalizeSettings(**n.model_dump()) for name, n in rc.task_normalize.items()},
                        NormalizeSettings(**rc.normalize.model_dump()))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def reward_groups(groups: list[Group], rewarder: Rewarder) -> dict[str, float]:
    """Score every rollout in place, dropping those whose grader failed; return the step's means."""
    return rewarder.score(groups)


def shape_overlong(groups: list[Group], ac: AlgorithmConfig, max_new_tokens: int) -> dict[str, float]:
    """DAPO's overlong shaping, as configured: the soft penalty on rewards, then the filter.

    Runs after dynamic sampling, which therefore judges groups on their task rewards.
    """
    rollouts = [r for g in groups for r in g.rollouts]
    penalty = 0.0
    for rollout in rollouts:
        shift = overlong_penalty(len(rollout.completion_ids), max_new_tokens, ac.overlong_buffer, ac.overlong_penalty)
        rollout.reward += shift
        penalty -= shift
    truncated = sum(r.finish_reason == "length" for r in rollouts)
    if ac.overlong_filter:
        mask_truncated(rollouts)
    return {"truncated_fraction": truncated / len(rollouts), "overlong_penalty": penalty / len(rollouts)}


def make_batch(groups: list[Group], estimator: AdvantageFn, pad_id: int, learner: Learner | None = None,
               gamma: float = 1.0, lam: float = 1.0) -> Batch:
    """The learner's batch with advantages; the learner (when given) supplies the critic's
    values and a KL penalty folded into the reward, where configured."""
    rollouts = [r for g in groups for r in g.rollouts]
    batch = collate(rollouts, pad_id)
    group_B = torch.tensor([i for i, g in enumerate(groups) for _ in g.rollouts])
    rewards_B = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
    values_BT = learner.values(batch) if learner is not None else None
    penalty_BT = learner.reward_penalty(batch) if learner is not None else None
    domains = {d: i for i, d in enumerate(dict.fromkeys(r.problem.domain or r.problem.task for r in rollouts))}
    domain_B = torch.tensor([domains[r.problem.domain or r.problem.task] for r in rollouts])
    batch.advantages_BT = estimator(AdvantageInputs(rewards_B, group_B, batch.loss_mask_BT, values_BT, penalty_BT,
                                                    gamma=gamma, lam=lam, domain_B=domain_B))
    if values_BT is not None:
        batch.values_BT, batch.returns_BT = values_BT, (batch.advantages_BT + values_BT) * batch.loss_mask_BT
    return batch


TIMING_KEYS = frozenset({"generate_s", "reward_s", "learn_s", "step_s", "generate_tok_s", "train_tok_s",
                         "weight_sync_s", "wait_s", "checkpoint_s"})
"""Record keys that measure wall-clock time: the only ones a resumed run may not repeat exactly."""


def build_pipeline(config: TrainConfig, mixture: Mixture, model, tokenizer, rewarder: Rewarder) -> Pipeline:
    """Workers placed as configured: the sync local pipeline shares the learner's model."""
    pc = config.pipeline
    shares = pc.mode == "sync" and pc.backend == "local"
    if pc.backend == "local":
        policy = model if shares else copy.deepcopy(model).eval()
        rollout = LocalHandle(RolloutWorker(policy, tokenizer, config.model.chat_template, config.rollout.batch_size,
                                            sampling_params(config), config.rollout.group_size, config.seed,
                                            config.rollout.bf16, config.rollout.share_decoding))
        reward = LocalHandle(RewardWorker(rewarder))
    else:
        rollout, reward = ray_workers(config)
    return Pipeline(mixture, rollout, reward, config.rollout.prompts_per_step, pc.mode, pc.max_staleness,
                    pc.buffer_rounds, shares_policy=shares)


def _ray_running() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized()


def ray_workers(config: TrainConfig) -> tuple[RayHandle, RayHandle]:
    try:
        import ray
    except ImportError:
        raise ConfigError("pipeline.backend=ray needs Ray: pip install 'tempering[ray]'") from None
    if not ray.is_initialized():
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local cluster, started here
        ray.init(address=config.pipeline.ray_address, include_dashboard=False, log_to_driver=False,
                 namespace="tempering", ignore_reinit_error=True)
    data = config.model_dump(mode="json")
    tag = f"{os.getpid()}-{id(config):x}"
    threads = max(1, config.threads // 2) if config.threads else auto_threads(share=2)
    rollout = RayHandle(RolloutWorker, "from_config", (data, config.seed, threads), f"tempering-rollout-{tag}",
                        config.pipeline.restart_limit, num_cpus=0)
    reward = RayHandle(RewardWorker, "from_config", (data,), f"tempering-reward-{tag}",
                       config.pipeline.restart_limit, num_cpus=0)
    return rollout, reward


def train(config: TrainConfig, progress: bool = True, resume: bool = False) -> dict:
    """Run RL training as configured; return the summary also written to ``summary.json``.

    With ``resume``, ``config.run_dir`` is an existing run: it continues from its newest
    complete checkpoint (or from the start when there is none) and ends exactly where an
    uninterrupted synchronous run would.
    """
    start = time.perf_counter()
    pc = config.pipeline
    governor = ThreadGovernor(config.threads, share=2 if pc.mode == "async" else 1)  # async: sampler and learner
    torch.manual_seed(config.seed)
    tasks = build_tasks(config)
    algorithm = resolve_algorithm(config)
    rewarder = build_rewarder(config, tasks)
    monitors = RewardMonitors(rewarder.specs, rewarder.metrics, MonitorSettings(**config.rewards.monitors.model_dump()))
    try:
        schedule = config.scheduler.model_dump(exclude={"balance_tokens", "max_domain_token_share"})
        mixture = Mixture(tasks, [s.weight for s in config.tasks], config.seed, schedule.pop("strategy"),
                          Settings(**schedule))
    except ValueError as exc:
        raise ConfigError(f"tasks: {exc} (tasks.N.weight)") from None

    if not resume and config.run_dir and (Path(config.run_dir) / "metrics.jsonl").exists():
        raise ConfigError(f"run_dir={config.run_dir} already holds a run; continue it with "
                          f"`temper train --resume {config.run_dir}` or choose another folder")
    model, tokenizer, model_path = load_policy(config.model.path, config.model.dtype, config.pretrain, progress)
    run_dir = make_run_dir(config.run_dir)
    learner = build_learner(model, config, algorithm)
    eval_generator = HFGenerator(model, tokenizer, config.model.chat_template, config.eval.batch_size)
    evaluation = lambda: evaluate(eval_generator, tasks, config.eval.problems_per_task, config.eval.max_new_tokens,  # noqa: E731
                                  config.rewards.options)
    owns_ray = pc.backend == "ray" and not _ray_running()
    pipeline = build_pipeline(config, mixture, model, tokenizer, rewarder)

    first_step, eval_before = 0, None
    timings = {"generate_s": 0.0, "reward_s": 0.0, "learn_s": 0.0}
    found = checkpoint.latest(run_dir) if resume else None
    if found is not None:
        state = restore(found, model, learner, mixture, pipeline, monitors)
        first_step, eval_before, timings = state["step"], state["eval_before"], state["timings"]
        checkpoint.clean_partial(run_dir)
    else:
        save_resolved(config, run_dir / "config.yaml")
    truncate_metrics(run_dir / "metrics.jsonl", first_step)
    if eval_before is None:
        eval_before = evaluation()

    def snapshot(step: int) -> dict:
        return {"step": step, "learner": learner.state_dict(), "mixture": mixture.state_dict(),
                "pipeline": pipeline.state_dict(), "monitors": monitors.state_dict(),
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                        "numpy": np.random.get_state()},
                "eval_before": eval_before, "timings": dict(timings)}

    metrics = MetricsWriter(run_dir / "metrics.jsonl")
    bar = tqdm(total=config.steps, initial=first_step, desc="train", disable=not progress, dynamic_ncols=True)
    ac = config.algorithm
    nonfinite_streak = 0
    checkpoint_s = None
    pipeline.publish(model, learner.version)
    pipeline.start()
    try:
        for step in range(first_step, config.steps):
            t0 = time.perf_counter()
            groups, record = collect_groups(pipeline.take, pipeline.score_of, config.rollout.prompts_per_step,
                                            ac.dynamic_sampling, ac.max_extra_rounds)
            wait_s = time.perf_counter() - t0
            record.update(pipeline.round_timings())
            if pc.mode == "async":
                record["wait_s"] = wait_s
            record.update(shape_overlong(groups, ac, config.rollout.max_new_tokens))
            t2 = time.perf_counter()
            groups, record["capped_groups"] = cap_domain_tokens(groups, config.scheduler.max_domain_token_share)
            batch = make_batch(groups, algorithm["advantage"], tokenizer.pad_token_id, learner, ac.gamma, ac.lam)
            if config.scheduler.balance_tokens:
                batch.weights_B = domain_token_weights_B(groups)
            record.update(learner.step(batch))
            record["weight_sync_s"] += pipeline.publish(model, learner.version)
            t3 = time.perf_counter()
            train_tokens = int(batch.attention_mask_BT.sum())
            counters = pipeline.counters
            record.update(step=step + 1, policy_version=learner.version, learn_s=t3 - t2, step_s=t3 - t0,
                          train_tokens=train_tokens, train_tok_s=train_tokens / (t3 - t2),
                          generate_tok_s=record["completion_tokens"] / max(record["generate_s"], 1e-9),
                          dropped_stale=counters.dropped_stale, rollouts_sampled=counters.rollouts_sampled,
                          rollouts_taken=counters.rollouts_taken, worker_restarts=pipeline.restarts)
            for key in timings:
                timings[key] += record[key]
            if config.eval.every and (step + 1) % config.eval.every == 0 and step + 1 < config.steps:
                result = evaluation()
                record["eval/accuracy"] = result["accuracy"]
                record.update({f"eval/{name}": value for name, value in result["per_task"].items()})
            record.update(monitors.update(groups, record), **governor.update())
            with pipeline.scheduler_lock():
                record.update(mixture.update())
            nonfinite_streak = nonfinite_streak + 1 if record["skipped_updates"] else 0
            if nonfinite_streak >= config.checkpoint.rollback_after:
                record["rollback_to"] = rollback(run_dir, model, learner, pipeline)
                nonfinite_streak = 0
            if checkpoint_s is not None:
                record["checkpoint_s"], checkpoint_s = checkpoint_s, None  # the previous step's save
            metrics.write(record)  # before the checkpoint: a resumed run never lacks a step's record
            every = config.checkpoint.every
            if every and ((step + 1) % every == 0 or step + 1 == config.steps):
                t4 = time.perf_counter()
                pipeline.pause()
                try:
                    checkpoint.save(run_dir, step + 1, model, tokenizer, snapshot(step + 1), config.checkpoint.keep)
                finally:
                    pipeline.resume()
                checkpoint_s = time.perf_counter() - t4
            bar.set_postfix(reward=f"{record['reward']:.2f}", acc=f"{record['accuracy']:.2f}",
                            s_step=f"{record['step_s']:.2f}")
            bar.update()
    finally:
        bar.close()
        metrics.close()
        pipeline.close()
        if pc.backend != "local":
            rewarder.close()  # the driver's copy only named the rewards; the actor's did the work
        if owns_ray:
            import ray

            ray.shutdown()

    eval_after = evaluation()
    final = run_dir / "checkpoint-final"
    checkpoint.save_model(model, tokenizer, final)
    counters = pipeline.counters
    summary = {
        "eval_before": eval_before, "eval_after": eval_after, "steps": config.steps,
        "wall_s": time.perf_counter() - start, "model": model_path, "checkpoint": str(final),
        "seconds_per_step": {k: v / max(config.steps, 1) for k, v in timings.items()},
        "resumed_from": first_step if resume else None,
        "rollouts": {"sampled": counters.rollouts_sampled, "taken": counters.rollouts_taken,
                     "dropped_stale": counters.dropped_stale, "left_in_buffer": pipeline.buffered,
                     "worker_restarts": pipeline.restarts},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if progress:
        print(before_after_table(eval_before, eval_after))
        print(mixture.table())
        print(f"run folder: {run_dir}  ({summary['wall_s']:.0f} s)")
    return summary


def restore(path: Path, model, learner: Learner, mixture: Mixture, pipeline: Pipeline,
            monitors: RewardMonitors) -> dict:
    """Load a checkpoint's whole state into the freshly built run; return the loop's part."""
    state = checkpoint.load_state(path)
    checkpoint.load_model_weights(model, path)
    learner.load_state_dict(state["learner"])
    try:  # a task whose stream the checkpoint cannot continue (another seed, a changed data file)
        mixture.load_state_dict(state["mixture"])
    except ValueError as exc:
        raise ConfigError(f"cannot resume from {path}: {exc}") from None
    pipeline.load_state_dict(state["pipeline"])
    monitors.load_state_dict(state["monitors"])
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    return state


def rollback(run_dir: Path, model, learner: Learner, pipeline: Pipeline) -> int:
    """Repeated non-finite steps: restore the last checkpoint's weights and optimizer, keep the
    data moving forward (so the same batches are not replayed); return the step restored."""
    found = checkpoint.latest(run_dir)
    if found is None:
        raise TrainingDiverged("training diverged: repeated non-finite losses or gradients, and no checkpoint "
                           "to roll back to (set checkpoint.every)")
    state = checkpoint.load_state(found)
    checkpoint.load_model_weights(model, found)
    version = learner.version
    learner.load_state_dict(state["learner"])
    learner.version = version  # versions only grow: rollouts stay comparable
    return state["step"]
