"""Config -> objects: every builder ``temper train`` (and the workers it places) uses.

This is the one place that reads a :class:`~tempering.config.TrainConfig`, with three
neighbours it calls: ``tempering.policy`` (which model, on which device, at what precision),
``tempering.rollout.engines`` (which sampler, and how vLLM starts) and ``tempering.placement``
(where Ray puts the workers). Components take plain arguments and
settings dataclasses whose fields are all required, so their values come from the config's
fields (and their defaults) and nowhere else; a unit test that wants a real run's settings
builds them here from a config too.

A bad name, option or combination found while building is a :class:`ConfigError` naming the
key. :func:`build_run` puts a whole run together; ``tempering.train`` loops over it.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from tempering import checkpoint
from tempering.algorithms import ADVANTAGES, AGGREGATIONS, LOSSES
from tempering.algorithms.advantages import needs_teacher, needs_values
from tempering.algorithms.losses import needs_reference, paired, required_advantage
from tempering.config import ConfigError, EnvSpec, PretrainConfig, TrainConfig
from tempering.envs.agent import AGENT_ENV, AgentSettings, agent_settings, with_agents
from tempering.envs.base import check_env
from tempering.envs.runner import with_envs
from tempering.eval.greedy import evaluate
from tempering.learner.forward import plain_head
from tempering.learner.optim import adamw, lr_factor
from tempering.learner.packing import parameter_count, tokens_for_memory
from tempering.learner.parallel import DataParallel, distribute, follow, from_env
from tempering.learner.step import Learner, LearnerSettings
from tempering.models.loading import ModelLoadError
from tempering.models.precision import Choice
from tempering.pipeline import Pipeline, RewardWorker, RolloutWorker
from tempering.placement import (ActorResources, RayLearner, RayReward, RayRollout, RewardHandle, RolloutHandle,
                                 actor_nodes, actor_placement, ray_running, reward_pool, rollout_pool, start_ray)
from tempering.policy import (load_model, load_policy, record_precision, resolve_model_path, resolve_precision,
                              run_device, with_lora)
from tempering.registry import resolve
from tempering.reporting.sinks import check_sinks
from tempering.rewards import (MonitorSettings, NormalizeSettings, RewardMonitors, Rewarder, TaskRewards,
                               resolve_reward)
from tempering.rollout.base import Generator, SamplingParams
from tempering.rollout.engines import build_sampler, builtin_sampler, uses_vllm, vllm_settings
from tempering.rollout.prompts import longest_token, prompt_limit, screen_datasets
from tempering.scheduler import Mixture, Settings
from tempering.tasks import Task, build_task
from tempering.threads import ThreadGovernor, auto_threads


def build_tasks(config: TrainConfig) -> list[Task]:
    """The configured tasks; a bad name, option or reward is a ConfigError naming the entry."""
    tasks = []
    for i, spec in enumerate(config.tasks):
        try:
            task = build_task(spec.name, seed=config.seed, **spec.options)
            if spec.rewards is not None:
                task.rewards = dict(spec.rewards)
            if spec.env is not None:
                check_task_env(spec.env)
            for reward in task.rewards:
                resolve_reward(reward)
            if not task.eval_problems(1):  # accuracy is measured before and after training
                raise ValueError("no held-out problems (for a dataset: options.eval_fraction above 0, or eval_path)")
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"tasks.{i} ({spec.name}): {exc}") from None
        tasks.append(task)
    if len({t.name for t in tasks}) != len(tasks):
        raise ConfigError("tasks: each task may appear once; give repeated ones distinct names")
    return tasks


def check_task_env(spec: EnvSpec) -> None:
    """Refuse an environment, or an agent, that its options rule out (a ValueError); an agent's
    calls are sampled by whichever sampler the run has (``tempering.envs.recording``)."""
    if spec.name != AGENT_ENV:
        check_env(spec.name, spec.options)
        return
    agent_settings(spec.options, spec.max_turns)
    if spec.max_tokens:
        raise ValueError("env.max_tokens does not apply to an agent (rollout.max_new_tokens bounds each call, "
                         "env.max_turns the calls); set it to 0")


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
    if needs_teacher(found["advantage"]) and ac.teacher.path is None:
        raise ConfigError(f"algorithm.advantage={ac.advantage} distils from a teacher: set algorithm.teacher.path")
    if ac.teacher.path is not None and not needs_teacher(found["advantage"]):
        raise ConfigError(f"algorithm.teacher.path is set but algorithm.advantage={ac.advantage} uses no teacher; "
                          "set algorithm.advantage=distill, or algorithm.teacher.path=null")
    check_paired_loss(config, found["loss"])
    return found


def check_paired_loss(config: TrainConfig, loss: Any) -> None:
    """Refuse a loss with a built-in estimator other than its own (``register_loss(advantage=...)``;
    a ``module:function`` plug-in is taken to mark what the loss reads its own way), and a paired
    loss (``online_dpo``) with random mini-batches, which would split a group's rows (several
    learner processes would too: :func:`check_parallel`)."""
    ac, wanted = config.algorithm, required_advantage(loss)
    if wanted is not None and ac.advantage != wanted and ":" not in ac.advantage:
        raise ConfigError(f"algorithm.loss={ac.loss} trains on what algorithm.advantage={wanted} marks (each group's "
                          f"best and worst rollout), not on algorithm.advantage={ac.advantage}; "
                          f"set algorithm.advantage={wanted}")
    if paired(loss) and config.learner.mini_batches > 1:
        raise ConfigError(f"learner.mini_batches={config.learner.mini_batches}: algorithm.loss={ac.loss} pairs the "
                          "rollouts of a group, which random mini-batches would split; set learner.mini_batches=1 "
                          "(learner.ppo_epochs may still be above 1)")


def load_teacher(config: TrainConfig, tokenizer, progress: bool) -> Any:
    """The configured teacher on the policy's device, or None without one; a ConfigError when it
    cannot be loaded or its tokenizer is not the policy's (distillation compares the two models'
    log-probs of the same token ids, which mean the same text only under one tokenizer)."""
    tc = config.algorithm.teacher
    if tc.path is None:
        return None
    try:
        teacher, teacher_tokenizer, _ = load_policy(tc.path, tc.dtype, tc.pretrain, progress,
                                                    device=run_device(config))
    except ModelLoadError as exc:
        raise ConfigError(f"algorithm.teacher.path={tc.path}: {exc}") from None
    ours, theirs = tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    if ours != theirs:
        token = min(set(ours.items()) ^ set(theirs.items()))[0]
        raise ConfigError(f"algorithm.teacher.path={tc.path}: its tokenizer is not the policy's ({len(theirs)} "
                          f"tokens against {len(ours)}; {token!r} is {_token_id(theirs, token)} for the teacher, "
                          f"{_token_id(ours, token)} for the policy); distillation needs the policy's tokenizer")
    return teacher


def _token_id(vocab: dict[str, int], token: str) -> str:
    return f"id {vocab[token]}" if token in vocab else "missing"


def sampling_params(config: TrainConfig) -> SamplingParams:
    rc = config.rollout
    return SamplingParams(temperature=rc.temperature, top_p=rc.top_p, max_new_tokens=rc.max_new_tokens,
                          stop=tuple(rc.stop), max_prompt_tokens=rc.max_prompt_tokens, long_prompts=rc.long_prompts)


def learner_token_budget(model, config: TrainConfig, critic: bool, teacher: Any = None) -> int:
    """``learner.token_budget``, or the one ``learner.memory_budget_gb`` allows (0 when neither is set);
    the frozen models beside the policy count (:func:`frozen_parameters`)."""
    lc = config.learner
    if lc.token_budget or not lc.memory_budget_gb:
        return lc.token_budget
    frozen = frozen_parameters(model, config, critic, teacher)
    try:
        tokens = tokens_for_memory(lc.memory_budget_gb, model, lc.gradient_checkpointing,
                                   logprob_chunk(model, config), frozen)
    except ValueError as exc:
        raise ConfigError(f"learner.memory_budget_gb={lc.memory_budget_gb}: {exc}") from None
    return max(1, tokens)


def frozen_parameters(model, config: TrainConfig, critic: bool, teacher: Any = None) -> int:
    """Parameters of the frozen models a learner step holds beside the policy: a reference copy
    (none with LoRA, whose reference is the policy with its adapters off), a critic model, a teacher."""
    ac = config.algorithm
    reference = ac.kl_coef > 0 or needs_reference(resolve(LOSSES, ac.loss, "loss"))
    copies = int(reference and config.model.lora is None) + int(critic and ac.critic == "model")
    return copies * parameter_count(model) + (parameter_count(teacher) if teacher is not None else 0)


def logprob_chunk(model, config: TrainConfig) -> int:
    """``learner.logprob_chunk``, or 0 (the model's own logits) for a model whose logits are more
    than its output layer's product (Gemma 2 soft-caps them), which chunks would not compute."""
    return config.learner.logprob_chunk if plain_head(model) else 0


def learner_settings(config: TrainConfig, algorithm: dict, token_budget: int) -> LearnerSettings:
    """The learner's settings, every field from the config (``algorithm`` from
    :func:`resolve_algorithm`, ``token_budget`` from :func:`learner_token_budget`)."""
    lc, ac = config.learner, config.algorithm
    return LearnerSettings(
        loss=algorithm["loss"], aggregation=algorithm["aggregation"],
        clip_low=ac.clip_low, clip_high=ac.clip_high, dual_clip=ac.dual_clip, entropy_coef=ac.entropy_coef,
        kl_coef=ac.kl_coef, kl_estimator=ac.kl_estimator, kl_clamp=ac.kl_clamp, kl_in_reward=ac.kl_in_reward,
        kl_target=ac.kl_target, kl_horizon=ac.kl_horizon,
        critic=ac.critic if needs_values(algorithm["advantage"]) else None,
        value_coef=ac.value_coef, value_clip=ac.value_clip,
        norm_length=ac.norm_length or config.rollout.max_new_tokens,
        ppo_epochs=lc.ppo_epochs, mini_batches=lc.mini_batches,
        temperature=config.rollout.temperature, micro_batch_size=lc.micro_batch_size,
        token_budget=token_budget, packing=lc.packing,
        logprob_chunk=lc.logprob_chunk, gradient_checkpointing=lc.gradient_checkpointing,
        grad_clip=lc.grad_clip, bf16=lc.bf16, off_policy=config.pipeline.off_policy, is_cap=config.pipeline.is_cap,
        mismatch_correction=config.pipeline.mismatch_correction, mismatch_low=config.pipeline.mismatch_low,
        mismatch_high=config.pipeline.mismatch_high, dpo_beta=ac.dpo_beta,
        skip_zero_advantage=lc.skip_zero_advantage, share_prompts=lc.share_prompts,
        merge_duplicates=lc.merge_duplicates,
    )


def build_learner(model, config: TrainConfig, algorithm: dict, teacher: Any = None,
                  parallel: Optional[DataParallel] = None, whole: Any = None) -> Learner:
    """The learner over ``model``; with ``parallel``, one of several learner processes, the
    model laid out as ``learner.parallel`` says (``tempering.learner.parallel``); under ``fsdp`` the
    leader's ``whole`` copy gets the gathered weights after every step."""
    lc = config.learner
    budget = learner_token_budget(model, config, needs_values(algorithm["advantage"]), teacher)
    settings = replace(learner_settings(config, algorithm, budget), logprob_chunk=logprob_chunk(model, config))
    if parallel is not None:
        check_parallel(config, settings)
        model = distribute(model, parallel)
        if parallel.kind == "fsdp":  # both reach the decoder and output layer past FSDP's gathers
            settings = replace(settings, logprob_chunk=0, share_prompts=False)
    schedule = lambda step: lr_factor(step, lc.warmup_steps, config.steps, lc.schedule, lc.min_lr_ratio)  # noqa: E731
    return Learner(model, adamw(model, lc.lr, lc.betas, lc.weight_decay), schedule, settings, teacher, parallel,
                   whole)


def check_parallel(config: TrainConfig, settings: LearnerSettings) -> None:
    """Refuse what ``learner.parallel=fsdp`` cannot run: the KL reference and the critic pass
    through the policy on one rank alone or more often than the idle passes match, and under
    FSDP every policy pass waits for every rank; LoRA adapters would be checkpointed as one
    rank's shards; a rank holds a shard of the gradient, not the whole that ``grad_share_every`` and
    ``grad_balance_rate`` measure. Under either, a paired loss (``online_dpo``) is refused: each
    rank takes a share of the rows, which splits groups."""
    if paired(settings.loss):
        raise ConfigError(f"algorithm.loss={config.algorithm.loss} pairs the rollouts of a group, which several "
                          "learner processes would split between them; run it in one process (without torchrun)")
    if config.learner.parallel != "fsdp":
        return
    if config.model.lora is not None:
        raise ConfigError("learner.parallel=fsdp: model.lora adapters are not sharded; set learner.parallel=ddp "
                          "(LoRA already keeps the trained weights small)")
    if settings.kl_coef > 0:
        raise ConfigError("learner.parallel=fsdp: algorithm.kl_coef > 0 needs a KL reference model, which is "
                          "not sharded; set learner.parallel=ddp, or algorithm.kl_coef=0")
    if settings.critic is not None:
        raise ConfigError(f"learner.parallel=fsdp: the critic of algorithm.advantage={config.algorithm.advantage} "
                          "is not sharded; set learner.parallel=ddp")
    if config.learner.grad_share_every:
        raise ConfigError("learner.parallel=fsdp: learner.grad_share_every needs the whole gradient on one rank, "
                          "and each holds a shard; set learner.grad_share_every=0, or learner.parallel=ddp")
    if config.learner.grad_balance_rate:
        raise ConfigError("learner.parallel=fsdp: learner.grad_balance_rate measures the whole gradient on one rank, "
                          "and each holds a shard; set learner.grad_balance_rate=0, or learner.parallel=ddp")


def check_grad_balance(config: TrainConfig) -> None:
    """Refuse gradient balancing with nothing to balance: it moves gradient between tasks."""
    if config.learner.grad_balance_rate and len(config.tasks) < 2:
        raise ConfigError(f"learner.grad_balance_rate={config.learner.grad_balance_rate} balances the gradient "
                          f"between tasks, and tasks has {len(config.tasks)}; give two or more tasks, or set "
                          "learner.grad_balance_rate=0")


def normalize_settings(config: Any) -> NormalizeSettings:
    """From a ``NormalizeConfig``."""
    return NormalizeSettings(**config.model_dump())


def monitor_settings(config: Any) -> MonitorSettings:
    """From a ``MonitorConfig``."""
    return MonitorSettings(**config.model_dump())


def scheduler_settings(config: Any) -> Settings:
    """From a ``SchedulerConfig`` (its strategy and batch balance are passed elsewhere, its
    pauses to the pipeline)."""
    return Settings(**config.model_dump(exclude={"strategy", "balance_tokens", "max_domain_token_share",
                                                 *PAUSE_FIELDS}))


PAUSE_FIELDS = ("pause_failing", "probe_rounds", "max_probe_rounds")
"""The scheduler's fields that the pipeline reads: when to pause a domain and probe it."""


def build_rewarder(config: TrainConfig, tasks: list[Task]) -> Rewarder:
    """The tasks' rewards with their options and normalization; a bad option is a ConfigError."""
    rc = config.rewards
    specs = [TaskRewards(t.name, dict(t.rewards), t.metric, t.domain) for t in tasks]
    try:
        return Rewarder(specs, with_reward_model_path(rc.options),
                        {name: normalize_settings(n) for name, n in rc.task_normalize.items()},
                        normalize_settings(rc.normalize))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def reward_model_path(path: str) -> str:
    """A reward model's path as ``tempering.rewards.model`` loads it: ``builtin:tiny`` (the
    tiny model of the default pre-training, which gets a new head) and run folders resolved
    like a policy's (:func:`resolve_model_path`), other paths as they are."""
    return resolve_model_path(path, PretrainConfig(), progress=False)


def with_reward_model_path(options: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``rewards.options`` with the ``model`` reward's ``path`` resolved (:func:`reward_model_path`);
    a path that cannot be is a ValueError naming the key."""
    model = options.get("model") or {}
    if not isinstance(model.get("path"), str):
        return options
    try:
        return {**options, "model": {**model, "path": reward_model_path(model["path"])}}
    except ModelLoadError as exc:
        raise ValueError(f"rewards.options.model.path: {exc}") from None


def build_mixture(config: TrainConfig, tasks: list[Task]) -> Mixture:
    try:
        return Mixture(tasks, [s.weight for s in config.tasks], config.seed, config.scheduler.strategy,
                       scheduler_settings(config.scheduler))
    except ValueError as exc:
        raise ConfigError(f"tasks: {exc} (tasks.N.weight)") from None


def env_specs(config: TrainConfig) -> dict[str, EnvSpec]:
    """Task name -> the environment its problems are played in, for the tasks that have one
    (other than an agent)."""
    return {spec.name: spec.env for spec in config.tasks if spec.env is not None and spec.env.name != AGENT_ENV}


def agent_specs(config: TrainConfig) -> dict[str, AgentSettings]:
    """Task name -> the agent that plays its problems (``tempering.envs.agent``), for the tasks that have one."""
    return {spec.name: agent_settings(spec.env.options, spec.env.max_turns) for spec in config.tasks
            if spec.env is not None and spec.env.name == AGENT_ENV}


def build_generator(config: TrainConfig, model, tokenizer, batch_size: int, bf16: bool = False,
                    share: bool = True) -> Generator:
    """The sampler ``rollout`` configures (``tempering.rollout.engines``), playing the tasks that
    have an environment (or an agent) as episodes."""
    return with_episodes(config, build_sampler(config, model, tokenizer, batch_size, bf16, share))


def local_generator(config: TrainConfig, model, tokenizer, batch_size: int, bf16: bool = False,
                    share: bool = True) -> Generator:
    """The built-in sampler over ``model``, playing the tasks that have an environment (or an
    agent) as episodes."""
    return with_episodes(config, builtin_sampler(config, model, tokenizer, batch_size, bf16, share))


def with_episodes(config: TrainConfig, sampler: Any) -> Generator:
    """``sampler`` playing the tasks that have an environment, and those that have an agent,
    as episodes (the agents' calls sampled by ``sampler`` too)."""
    return with_agents(with_envs(sampler, env_specs(config)), sampler, agent_specs(config))


def check_mismatch_band(config: TrainConfig) -> None:
    """A masking band that keeps no ratio would train on nothing: refused before the model loads."""
    pc = config.pipeline
    if pc.mismatch_correction in ("mis_token", "mis_sequence") and pc.mismatch_low > pc.mismatch_high:
        raise ConfigError(f"pipeline.mismatch_low={pc.mismatch_low} is above pipeline.mismatch_high="
                          f"{pc.mismatch_high}: {pc.mismatch_correction} would mask every token; give low <= high")


def check_onednn(config: TrainConfig) -> None:
    """``rollout.onednn`` changes the built-in sampler's products only: with a server or vLLM
    sampling ``true`` would do nothing, so it is refused rather than ignored (``auto`` is the default
    and asks for nothing there)."""
    rc = config.rollout
    if rc.onednn is True and (rc.server is not None or rc.engine != "builtin"):
        sampler = "rollout.server" if rc.server is not None else f"rollout.engine={rc.engine}"
        raise ConfigError(f"rollout.onednn=true sets the built-in sampler's products, but {sampler} samples here; "
                          "drop rollout.onednn or sample with the built-in sampler")


def check_partial_rollouts(config: TrainConfig) -> None:
    """Partial rollouts need new weights while a round is sampled (async, workers in this
    process) by a sampler that takes them between decoding steps (the built-in one) or between
    the chunks of its requests (a server, ``rollout.server``): refused elsewhere rather than
    ignored."""
    pc, rc = config.pipeline, config.rollout
    if not pc.partial_rollouts:
        return
    if pc.mode != "async" or pc.backend != "local":
        raise ConfigError(f"pipeline.partial_rollouts=true updates weights during an asynchronous round in this "
                          f"process, but pipeline.mode={pc.mode} and backend={pc.backend}; set mode=async and "
                          "backend=local, or drop partial_rollouts")
    if rc.engine != "builtin" or env_specs(config) or agent_specs(config):
        raise ConfigError("pipeline.partial_rollouts=true needs the built-in sampler or a server (rollout.server) "
                          "drawing single completions (rollout.engine=builtin, no tasks with an environment or "
                          "agent); drop partial_rollouts for this run")


def rollout_worker(config: TrainConfig, model, tokenizer) -> RolloutWorker:
    rc = config.rollout
    generator = build_generator(config, model, tokenizer, rc.batch_size, rc.bf16, rc.share_decoding)
    return RolloutWorker(generator, sampling_params(config), rc.group_size, config.seed)


def remote_rollout_worker(data: dict, threads: int, index: int = 0) -> RolloutWorker:
    """A rollout worker that loads its own model (in another process: a Ray actor); the
    ``index``-th of several draws its own random stream."""
    torch.set_num_threads(threads)
    config = TrainConfig.model_validate(data)
    device = "cuda" if torch.cuda.is_available() and config.pipeline.rollout_gpus > 0 else "cpu"
    model, tokenizer, _ = load_policy(config.model.path, config.model.dtype, config.pretrain, progress=False,
                                      device=torch.device(device))
    worker = rollout_worker(config, with_lora(config, model).eval(), tokenizer)
    worker.rng.manual_seed(config.seed + 7919 * index)
    return worker


def remote_reward_worker(data: dict) -> RewardWorker:
    """A reward worker with its own tasks and rewards (in another process: a Ray actor)."""
    config = TrainConfig.model_validate(data)
    return RewardWorker(build_rewarder(config, build_tasks(config)))


def build_pipeline(config: TrainConfig, mixture: Mixture, model, tokenizer, rewarder: Rewarder) -> Pipeline:
    """Workers placed as configured: the sync local pipeline shares the learner's model."""
    pc = config.pipeline
    served = config.rollout.server is not None or config.rollout.engine == "vllm"  # the sampler holds its own copy
    shares = pc.mode == "sync" and pc.backend == "local" and not served
    if pc.backend == "local":
        if max(pc.rollout_workers, pc.reward_workers) > 1:
            raise ConfigError("pipeline.rollout_workers and reward_workers above 1 need pipeline.backend=ray")
        policy = model if shares or served else copy.deepcopy(model).eval()  # a server holds its own copy
        rollout, reward = rollout_worker(config, policy, tokenizer), RewardWorker(rewarder)
    else:
        if pc.reward_workers > 1 and normalizes(config):
            raise ConfigError("pipeline.reward_workers > 1: each reward actor would keep its own normalization "
                              "statistics; set rewards.normalize.mode=none (and task_normalize) or reward_workers=1")
        rollout, reward = ray_workers(config)
    return Pipeline(mixture, rollout, reward, config.rollout.prompts_per_step, pc.mode, pc.max_staleness,
                    pc.buffer_rounds, shares_policy=shares, max_outage_rounds=config.rewards.max_outage_rounds,
                    outage_backoff_s=config.rewards.outage_backoff_s, pause_failing=config.scheduler.pause_failing,
                    probe_rounds=config.scheduler.probe_rounds, max_probe_rounds=config.scheduler.max_probe_rounds,
                    partial_rollouts=pc.partial_rollouts, partial_chunk=pc.partial_chunk_tokens)


def normalizes(config: TrainConfig) -> bool:
    """Whether rewards are normalized with running statistics for some task."""
    rc = config.rewards
    return any(n.mode != "none" for n in [rc.normalize, *rc.task_normalize.values()])


def ray_workers(config: TrainConfig) -> tuple[RolloutHandle, RewardHandle]:
    """The rollout and reward actors ``pipeline`` asks for, each built from the config inside its actor."""
    start_ray(config.pipeline.ray_address)
    pc = config.pipeline
    data = config.model_dump(mode="json")
    tag = f"{os.getpid()}-{id(config):x}"
    threads = max(1, config.threads // 2) if config.threads else auto_threads(share=2)
    bundles = actor_placement(config)
    rollout_resources = ActorResources(pc.rollout_resources, "pipeline.rollout_resources", pc.actor_start_s)
    reward_resources = ActorResources(pc.reward_resources, "pipeline.reward_resources", pc.actor_start_s)
    rollouts = [RayRollout(remote_rollout_worker, (data, threads, i),
                           f"tempering-rollout-{tag}" + (f"-{i}" if i else ""), pc.restart_limit, pc.rollout_cpus,
                           num_gpus=pc.rollout_gpus, placement=next(bundles), resources=rollout_resources)
                for i in range(pc.rollout_workers)]
    rewards = [RayReward(remote_reward_worker, (data,), f"tempering-reward-{tag}" + (f"-{i}" if i else ""),
                         pc.restart_limit, pc.reward_cpus, placement=next(bundles), resources=reward_resources)
               for i in range(pc.reward_workers)]
    return rollout_pool(rollouts), reward_pool(rewards)


@dataclass
class Run:
    """Everything a training run is made of, built from its config."""

    config: TrainConfig
    threads: ThreadGovernor
    """torch's CPU threads: the configured count, or the free cores counted again every few steps."""
    folder: checkpoint.RunFolder
    """The run folder, held while this process writes it, and where the run continues from."""
    model: Any
    tokenizer: Any
    model_path: str
    tasks: list[Task]
    algorithm: dict
    rewarder: Rewarder
    monitors: RewardMonitors
    mixture: Mixture
    learner: Learner | RayLearner
    """In this process (or torchrun's), or on Ray actors (``pipeline.learner=ray``)."""
    pipeline: Pipeline
    evaluate: Callable[[], dict]
    """Greedy held-out accuracy of the current policy (see ``tempering.eval.greedy``)."""
    owns_ray: bool
    """Whether this run started the Ray cluster it uses (and so shuts it down)."""
    precision: Optional[Choice] = None
    """What ``precision`` chose (None: unset, learner.bf16 and rollout.bf16 as configured)."""

    @property
    def run_dir(self) -> Path:
        return self.folder.path

    def ray_nodes(self) -> dict[str, list[str]]:
        """The ids of the Ray nodes each kind of actor runs on, one per actor (none in this process)."""
        return {"learner": list(getattr(self.learner, "nodes", [])), "rollout": actor_nodes(self.pipeline.rollout),
                "reward": actor_nodes(self.pipeline.reward)}

    def close(self) -> None:
        if self.learner.parallel is not None:
            self.learner.parallel.tell("stop")
        if isinstance(self.learner, RayLearner):
            self.learner.close()
        self.pipeline.close()
        if self.config.pipeline.backend != "local":
            self.rewarder.close()  # the driver's copy only named the rewards; the actor's did the work
        if self.owns_ray:
            import ray

            ray.shutdown()


def build_run(config: TrainConfig, progress: bool, resume: bool) -> Run:
    """Build a run: everything that can be refused is checked before the model is loaded."""
    threads = ThreadGovernor(config.threads, share=2 if config.pipeline.mode == "async" else 1)  # sampler, learner
    torch.manual_seed(config.seed)
    tasks = build_tasks(config)
    algorithm = resolve_algorithm(config)
    rewarder = build_rewarder(config, tasks)
    monitors = RewardMonitors(rewarder.specs, rewarder.metrics, monitor_settings(config.rewards.monitors))
    mixture = build_mixture(config, tasks)
    check_sinks(config.logging.sinks)
    check_mismatch_band(config)
    check_onednn(config)
    check_partial_rollouts(config)
    check_grad_balance(config)
    if uses_vllm(config):
        vllm_settings(config)
    checkpoint.check_run_dir(config.run_dir, resume)
    parallel = learner_processes(config)
    model, tokenizer, model_path = load_model(config, config.model.path, progress)
    config, choice = resolve_precision(config, model, resume)  # before the followers, who find it cached
    if parallel is not None:
        parallel.barrier()  # the model is on disk (pre-trained if built in): the followers load it now
    model = with_lora(config, model)
    policy = sampling_copy(model, parallel)
    eval_generator = local_generator(config, policy, tokenizer, config.eval.batch_size)  # the learner's weights
    rc = config.rollout
    screen_datasets(tasks, eval_generator.encode_prompt, prompt_limit(model.config, rc.max_prompt_tokens,
                    rc.max_new_tokens), rc.long_prompts, longest_token(tokenizer))
    folder = checkpoint.open_run(config.run_dir, resume)
    record_precision(folder.path, choice)
    owns_ray = uses_ray(config) and not ray_running()
    if config.pipeline.learner == "ray":
        learner = ray_learner(config, policy)
    else:
        teacher = load_teacher(config, tokenizer, progress)
        learner = build_learner(model, config, algorithm, teacher, parallel, None if policy is model else policy)
    ec = config.eval
    evaluation = lambda: evaluate(eval_generator, tasks, ec.problems_per_task, ec.max_new_tokens,  # noqa: E731
                                  config.rewards.options, stop=config.rollout.stop,
                                  problems_per_length=ec.problems_per_length)
    pipeline = build_pipeline(config, mixture, policy, tokenizer, rewarder)
    return Run(config, threads, folder, policy, tokenizer, model_path, tasks, algorithm, rewarder, monitors,
               mixture, learner, pipeline, evaluation, owns_ray, choice)


def uses_ray(config: TrainConfig) -> bool:
    """Whether the run puts workers or its learner on Ray actors."""
    return config.pipeline.backend == "ray" or config.pipeline.learner == "ray"


def ray_learner(config: TrainConfig, mirror: Any) -> RayLearner:
    """The learner as ``pipeline.learner_workers`` Ray actors, each built by :func:`remote_learner`
    from the (resolved) config; ``mirror``, the driver's policy, is the weights they start from."""
    pc = config.pipeline
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("pipeline.learner=ray runs the learner's ranks as Ray actors (pipeline.learner_workers); "
                          "start the run without torchrun")
    start_ray(pc.ray_address)
    threads = config.threads or auto_threads()
    return RayLearner(remote_learner, (config.model_dump(mode="json"), threads), mirror,
                      f"tempering-learner-{os.getpid()}-{id(config):x}", pc.learner_workers, pc.learner_cpus,
                      pc.learner_gpus, ActorResources(pc.learner_resources, "pipeline.learner_resources",
                                                      pc.actor_start_s), follow)


def remote_learner(data: dict, threads: int) -> Learner:
    """One rank of a learner on Ray (in another process: a Ray actor), its model loaded there;
    with several ranks, the process group is joined from the environment the actor set."""
    torch.set_num_threads(threads)
    config = TrainConfig.model_validate(data)
    torch.manual_seed(config.seed)
    algorithm = resolve_algorithm(config)
    parallel = learner_processes(config)
    model, tokenizer, _ = load_model(config, config.model.path, progress=False)
    model = with_lora(config, model)
    leads = parallel is None or parallel.leads  # as under torchrun: the others hold no whole copy, no teacher
    policy = sampling_copy(model, parallel) if leads else model
    teacher = load_teacher(config, tokenizer, progress=False) if leads else None
    return build_learner(model, config, algorithm, teacher, parallel, None if policy is model else policy)


def learner_processes(config: TrainConfig) -> Optional[DataParallel]:
    """This process's place among the learners ``torchrun`` started, or None when alone."""
    return from_env(config.learner.parallel, run_device(config))


def sampling_copy(model: Any, parallel: Optional[DataParallel]) -> Any:
    """The policy the leader samples, evaluates and saves with: the learner's own model, or
    under ``fsdp`` (which shards that one in place) a plain copy taken before sharding."""
    if parallel is None or parallel.kind != "fsdp":
        return model
    return copy.deepcopy(model).eval()


def build_follower(config: TrainConfig) -> Learner:
    """A learner process other than the leader: the policy and its learner, nothing else
    (the leader samples, scores, evaluates and writes the run folder)."""
    torch.manual_seed(config.seed)
    algorithm = resolve_algorithm(config)
    parallel = learner_processes(config)
    parallel.barrier()  # the leader loads the model first
    model, _, _ = load_model(config, config.model.path, progress=False)
    config, _ = resolve_precision(config, model, resume=True)  # the leader's choice, from the run folder
    return build_learner(with_lora(config, model), config, algorithm, parallel=parallel)
