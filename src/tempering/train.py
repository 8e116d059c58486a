"""``temper train``: the RL loop, top to bottom.

build (model, tasks, sampler, learner) -> evaluate -> repeat {sample groups -> reward ->
advantages -> learner step -> log} -> evaluate -> save. Everything else is a function or
object this file calls; reading this file should be enough to know what a step does.

Deliberately left out here: asynchronous sampling, Ray placement and resume from a mid-run
checkpoint; each lives in its own module when added. Adaptive mixtures are
``tempering.scheduler``'s: the loop shows it every sampled group and closes each step.
DAPO's dynamic sampling and overlong shaping are in ``tempering.algorithms.dapo``.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from pathlib import Path

import torch
from tqdm import tqdm

from tempering.algorithms import ADVANTAGES, AGGREGATIONS, LOSSES, AdvantageInputs
from tempering.algorithms.advantages import AdvantageFn, needs_values
from tempering.algorithms.dapo import collect_groups, mask_truncated, overlong_penalty
from tempering.config import AlgorithmConfig, ConfigError, TrainConfig, save_resolved
from tempering.evaluate import evaluate
from tempering.learner import Learner, LearnerSettings, collate, lr_factor
from tempering.models.loading import load_policy
from tempering.reporting import MetricsWriter, before_after_table
from tempering.rewards import MonitorSettings, NormalizeSettings, RewardMonitors, Rewarder, resolve_reward
from tempering.rollout.hf import HFGenerator, SamplingParams
from tempering.scheduler import Mixture, Settings, cap_domain_tokens, domain_token_weights_B
from tempering.tasks import Task, build_task
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


def build_learner(model, config: TrainConfig, algorithm: dict) -> Learner:
    lc, ac = config.learner, config.algorithm
    optimizer = torch.optim.AdamW(model.parameters(), lr=lc.lr, betas=lc.betas, weight_decay=lc.weight_decay)
    settings = LearnerSettings(
        loss=algorithm["loss"], aggregation=algorithm["aggregation"],
        clip_low=ac.clip_low, clip_high=ac.clip_high, dual_clip=ac.dual_clip, entropy_coef=ac.entropy_coef,
        kl_coef=ac.kl_coef, kl_estimator=ac.kl_estimator, kl_in_reward=ac.kl_in_reward,
        kl_target=ac.kl_target, kl_horizon=ac.kl_horizon,
        critic=ac.critic if needs_values(algorithm["advantage"]) else None,
        value_coef=ac.value_coef, value_clip=ac.value_clip,
        norm_length=ac.norm_length or config.rollout.max_new_tokens,
        ppo_epochs=lc.ppo_epochs, mini_batches=lc.mini_batches,
        temperature=config.rollout.temperature, micro_batch_size=lc.micro_batch_size,
        grad_clip=lc.grad_clip, bf16=lc.bf16,
    )
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


def train(config: TrainConfig, progress: bool = True) -> dict:
    """Run RL training as configured; return the summary also written to ``summary.json``."""
    start = time.perf_counter()
    torch.set_num_threads(config.threads or os.cpu_count() or 1)
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

    model, tokenizer, model_path = load_policy(config.model.path, config.model.dtype, config.pretrain, progress)
    run_dir = make_run_dir(config.run_dir)
    save_resolved(config, run_dir / "config.yaml")
    generator = HFGenerator(model, tokenizer, config.model.chat_template, config.rollout.batch_size,
                            config.rollout.bf16)
    eval_generator = HFGenerator(model, tokenizer, config.model.chat_template, config.eval.batch_size)
    learner = build_learner(model, config, algorithm)
    sampling = SamplingParams(temperature=config.rollout.temperature, top_p=config.rollout.top_p,
                              max_new_tokens=config.rollout.max_new_tokens, stop=tuple(config.rollout.stop))
    rng = torch.Generator().manual_seed(config.seed)
    evaluation = lambda: evaluate(eval_generator, tasks, config.eval.problems_per_task, config.eval.max_new_tokens)  # noqa: E731

    eval_before = evaluation()
    metrics = MetricsWriter(run_dir / "metrics.jsonl")
    bar = tqdm(total=config.steps, desc="train", disable=not progress, dynamic_ncols=True)
    timings = {"generate_s": 0.0, "reward_s": 0.0, "learn_s": 0.0}
    ac = config.algorithm
    sample = lambda n: generator.generate(mixture.next_problems(n), config.rollout.group_size,  # noqa: E731
                                          sampling, learner.version, rng)

    def score_groups(groups: list[Group]) -> dict[str, float]:
        record = reward_groups(groups, rewarder)
        mixture.observe(groups)  # every sampled group, before dynamic sampling drops any
        return record

    for step in range(config.steps):
        t0 = time.perf_counter()
        groups, record = collect_groups(sample, score_groups, config.rollout.prompts_per_step,
                                        ac.dynamic_sampling, ac.max_extra_rounds)
        record.update(shape_overlong(groups, ac, config.rollout.max_new_tokens))
        t2 = time.perf_counter()
        groups, record["capped_groups"] = cap_domain_tokens(groups, config.scheduler.max_domain_token_share)
        batch = make_batch(groups, algorithm["advantage"], tokenizer.pad_token_id, learner, ac.gamma, ac.lam)
        if config.scheduler.balance_tokens:
            batch.advantages_BT *= domain_token_weights_B(groups)[:, None]
        record.update(learner.step(batch))
        t3 = time.perf_counter()
        train_tokens = int(batch.attention_mask_BT.sum())
        record.update(step=step + 1, policy_version=learner.version, learn_s=t3 - t2, step_s=t3 - t0,
                      train_tokens=train_tokens, generate_tok_s=record["completion_tokens"] / record["generate_s"],
                      train_tok_s=train_tokens / (t3 - t2))
        for key in timings:
            timings[key] += record[key]
        if config.eval.every and (step + 1) % config.eval.every == 0 and step + 1 < config.steps:
            result = evaluation()
            record["eval/accuracy"] = result["accuracy"]
            record.update({f"eval/{name}": value for name, value in result["per_task"].items()})
        record.update(monitors.update(groups, record))
        record.update(mixture.update())
        metrics.write(record)
        bar.set_postfix(reward=f"{record['reward']:.2f}", acc=f"{record['accuracy']:.2f}",
                        s_step=f"{record['step_s']:.2f}")
        bar.update()
    bar.close()
    metrics.close()
    rewarder.close()

    eval_after = evaluation()
    checkpoint = run_dir / "checkpoint-final"
    model.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    summary = {
        "eval_before": eval_before, "eval_after": eval_after, "steps": config.steps,
        "wall_s": time.perf_counter() - start, "model": model_path, "checkpoint": str(checkpoint),
        "seconds_per_step": {k: v / max(config.steps, 1) for k, v in timings.items()},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if progress:
        print(before_after_table(eval_before, eval_after))
        print(mixture.table())
        print(f"run folder: {run_dir}  ({summary['wall_s']:.0f} s)")
    return summary
