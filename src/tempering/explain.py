"""``temper explain``: what a config will do, before it runs.

The arithmetic is the run's own: the rollouts of a step, the updates the learner makes on
them (``ppo_epochs`` x ``mini_batches``), and the micro-batches of each update, planned by
``tempering.learner.plan.plan_update`` (the learner's planner) on a batch of the step's shape where
every completion is ``rollout.max_new_tokens`` long and nothing is skipped or merged: an upper
bound, reached when no row is left out (``learner.skip_zero_advantage``,
``learner.merge_duplicates`` leave some out in most steps).
Each task's expected share of the first draws is the mixture's the run starts with; what the
strategy does with them after is said, not predicted (an adaptive one moves them on what the
run measures).

A config ``temper train`` would refuse before loading its model (an unknown built-in model,
task, reward option or algorithm) is refused here the same way. When the model can be
inspected (a local folder, a cached built-in model; nothing is
downloaded or pre-trained for it), the prompts are its tokens (the longest of a sample of
each drawn task's problems, at its curriculum's last level), the token budget ``learner.memory_budget_gb`` gives is computed,
memory is estimated from the model's shape (``tempering.learner.packing.memory_costs``) and the
learner's time per step is measured: one forward and backward pass of a micro-batch of at most
512 tokens, timed after one untimed pass, scaled by the tokens of a step's updates
(:func:`learner_tokens`: a group's prompt once where the learner shares prompts). Sampling
time is not estimated.

A probe (``probe`` held-out problems per task, 8 by default, greedy, ``eval.max_new_tokens``)
then looks for the two traps only a model shows: a task it scores 0 on (no sample earns a
reward, so RL has nothing to learn from: usually a format the model does not write, which
``grading: lenient`` or a prompt ``template`` fixes) and answers cut off at the length limit
(graded as written, so they count as wrong). A probe is a handful of problems: a task that
passes it can still be near 0, which ``temper eval`` measures.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tempering.algorithms.advantages import needs_values
from tempering.config import ConfigError, TrainConfig
from tempering.learner.forward import can_share_prompts
from tempering.learner.packing import memory_costs
from tempering.learner.plan import PlanChoices, plan_update
from tempering.models.device import resolve_device, slow_bf16
from tempering.models.loading import ModelLoadError
from tempering.models.precision import Choice, emulated
from tempering.rollout.fast_llama import ONEDNN_AUTO_WIDTH
from tempering.types import Batch


@dataclass
class Inspection:
    """What the loaded model tells: prompt tokens, context, budget, memory and speed."""

    model: Any = None
    generator: Any = None
    why_not: str = ""
    """Why the model could not be inspected; empty when it was."""
    prompt_tokens: int = 0
    context: int = 0
    token_budget: int = 0
    share_prompts: bool = True
    notes: list[str] = field(default_factory=list)


def refuse_as_train_does(config: TrainConfig) -> Any:
    """What ``temper train`` refuses from the config alone, before its model loads, refused here
    too (a ConfigError or ModelLoadError), so that a config explain passes is not one train
    then refuses: a built-in model name, the tasks and their rewards' options, the algorithm,
    the mixture, the sinks and the pipeline's band. Returns the mixture the run would start with."""
    from tempering.build import build_mixture, build_rewarder, build_tasks, check_mismatch_band, check_onednn, check_partial_rollouts, resolve_algorithm
    from tempering.policy import check_builtin_name
    from tempering.reporting.sinks import check_sinks

    check_builtin_name(config.model.path)
    tasks = build_tasks(config)
    resolve_algorithm(config)
    build_rewarder(config, tasks).close()
    mixture = build_mixture(config, tasks)
    check_sinks(config.logging.sinks)
    check_mismatch_band(config)
    check_onednn(config)
    check_partial_rollouts(config)
    return mixture


def inspect_model(config: TrainConfig) -> Inspection:
    """The model loaded without downloading or pre-training anything, and what it tells."""
    from tempering.build import build_generator, learner_token_budget, local_generator, resolve_algorithm
    from tempering.policy import load_model
    from tempering.pretrain import PRETRAINED_BUILTINS, builtin_pretrain, cached_model_dir
    from tempering.rollout.engines import uses_vllm

    path = config.model.path
    if path in PRETRAINED_BUILTINS and not (
            cached_model_dir(builtin_pretrain(path, config.pretrain)) / "config.json").exists():
        return Inspection(why_not=f"{path} is not pre-trained yet (temper pretrain makes it)")
    if not path.startswith("builtin:") and not Path(path).expanduser().exists():
        return Inspection(why_not=f"{path} is not a local folder or file, and explain downloads nothing")
    try:
        model, tokenizer, _ = load_model(config, path, progress=False)
    except (ModelLoadError, ConfigError, OSError, ImportError) as exc:
        return Inspection(why_not=str(exc).splitlines()[0])
    # vLLM is not started to explain a run: its prompts and probe are the built-in sampler's
    generator = (local_generator(config, model, tokenizer, config.rollout.batch_size) if uses_vllm(config)
                 else build_generator(config, model, tokenizer, config.rollout.batch_size))
    prompts = [len(generator.encode_prompt(p.prompt)) for task in trained_at_hardest(config)
               for p in task.eval_problems(32)]
    critic = needs_values(resolve_algorithm(config)["advantage"])
    return Inspection(model=model, generator=generator, prompt_tokens=max(prompts),
                      context=model.config.max_position_embeddings or 0,
                      token_budget=learner_token_budget(model, config, critic),
                      share_prompts=config.learner.share_prompts and can_share_prompts(
                          model, checkpointed=config.learner.gradient_checkpointing))


def trained_at_hardest(config: TrainConfig) -> list:
    """The tasks a run draws from (weight above 0; all of them when none is), each at its
    curriculum's last level: the prompts a step may reach, not the first level's alone nor an
    evaluation-only task's."""
    from tempering.build import build_tasks

    tasks = build_tasks(config)
    drawn = [task for spec, task in zip(config.tasks, tasks) if spec.weight > 0] or tasks
    for task in drawn:
        if getattr(task, "levels", 0):
            task.level = task.levels - 1
    return drawn


def update_batch(rows: int, group_size: int, prompt_tokens: int, completion_tokens: int) -> Batch:
    """A batch of one update's shape: ``rows`` rows of a prompt (one per group) and a completion
    of ``completion_tokens``, every row distinct and with signal, so the plan keeps them all."""
    width = prompt_tokens + completion_tokens
    ids_BT = torch.arange(rows * width).reshape(rows, width) % 50000 + 3
    for row in range(rows):
        ids_BT[row, :prompt_tokens] = row // group_size + 3
    mask_BT = torch.zeros(rows, width)
    mask_BT[:, prompt_tokens:] = 1
    return Batch(input_ids_BT=ids_BT, attention_mask_BT=torch.ones(rows, width, dtype=torch.long),
                 loss_mask_BT=mask_BT, old_logprobs_BT=torch.zeros(rows, width), advantages_BT=mask_BT.clone(),
                 policy_versions_B=torch.zeros(rows, dtype=torch.long),
                 prompt_lengths_B=torch.full((rows,), prompt_tokens))


def micro_batches(config: TrainConfig, seen: Inspection, rows: int) -> list[list[int]]:
    """The learner's micro-batches of an update on ``rows`` full-length rows (``plan_update``)."""
    lc = config.learner
    batch = update_batch(rows, config.rollout.group_size, max(seen.prompt_tokens, 1), config.rollout.max_new_tokens)
    plan = plan_update(batch, PlanChoices(skip_zero_advantage=False, merge_duplicates=False,
                                          share_prompts=seen.share_prompts, packing=lc.packing,
                                          token_budget=seen.token_budget, micro_batch_size=lc.micro_batch_size,
                                          chunk=lc.logprob_chunk))
    return [part.rows for part in plan.micro_batches]


def measure_seconds_per_token(model: Any, tokens: int) -> float:
    """Seconds per token of one forward and backward pass of the model, measured on a row of
    ``tokens`` random ids (at most 512) after one untimed pass; the weights are not changed."""
    width = max(2, min(tokens, 512))
    ids = torch.randint(3, model.config.vocab_size, (1, width), device=next(model.parameters()).device)
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        model(input_ids=ids).logits.float().mean().backward()
        seconds.append(time.perf_counter() - start)
    model.zero_grad(set_to_none=True)
    return seconds[-1] / width


def warnings_for(config: TrainConfig, seen: Inspection) -> list[str]:
    """Known traps in this config, as sentences saying what to change."""
    found = []
    keys = [key for key, on in (("rollout.bf16", config.rollout.bf16), ("learner.bf16", config.learner.bf16)) if on]
    device = resolve_device(config.model.device)
    reason = (slow_bf16(device, keys) if config.precision is None
              else emulated(device, Choice(config.learner.bf16, "")))
    if reason:
        found.append(reason)
    if config.eval.max_new_tokens < config.rollout.max_new_tokens:
        found.append(f"eval.max_new_tokens={config.eval.max_new_tokens} is shorter than rollout.max_new_tokens="
                     f"{config.rollout.max_new_tokens}: answers the policy learns to write may be cut off when "
                     "evaluated and count as wrong")
    for spec in config.tasks:
        if spec.env is None or not seen.context:
            continue
        budget = spec.env.max_tokens or spec.env.max_turns * config.rollout.max_new_tokens
        if seen.prompt_tokens + budget > seen.context:
            found.append(f"task {spec.name}: an episode may reach {seen.prompt_tokens} prompt + {budget} tokens "
                         f"(env.max_tokens, or env.max_turns x rollout.max_new_tokens), over the model's context "
                         f"of {seen.context}; lower env.max_turns or env.max_tokens")
    return found


def probe_warnings(config: TrainConfig, seen: Inspection, problems: int) -> list[str]:
    """The traps a greedy pass over ``problems`` held-out problems per task shows: a task
    scored 0, answers cut off at ``eval.max_new_tokens`` (in over a quarter of them)."""
    from tempering.build import build_tasks
    from tempering.eval.greedy import evaluate

    if seen.model is None or problems <= 0:
        return []
    result = evaluate(seen.generator, build_tasks(config), problems, config.eval.max_new_tokens,
                      config.rewards.options, stop=config.rollout.stop)
    found = []
    for name, accuracy in result["per_task"].items():
        count, cut = result["problems"][name], result["truncated"][name]
        if accuracy == 0:
            found.append(f"task {name}: the model scores 0 on {count} held-out problems (greedy), so RL may get no "
                         "reward to learn from; check that it writes the answer format the task grades "
                         "(grading: lenient, or a prompt template that asks for it)")
        if cut > count / 4:
            found.append(f"task {name}: {cut} of {count} greedy answers reached eval.max_new_tokens="
                         f"{config.eval.max_new_tokens} and are graded cut off; raise eval.max_new_tokens "
                         "(and rollout.max_new_tokens)")
    return found


def explain(config: TrainConfig, probe: int = 8) -> str:
    """The text ``temper explain`` prints; ``probe``: held-out problems per task in the probe
    for a task scored 0 and answers cut off (0 = none)."""
    rc, lc = config.rollout, config.learner
    if config.threads:
        torch.set_num_threads(config.threads)
    mixture = refuse_as_train_does(config)
    seen = inspect_model(config)
    config, numbers = _precision(config, seen)
    rc, lc = config.rollout, config.learner
    rollouts = rc.prompts_per_step * rc.group_size
    updates = lc.ppo_epochs * lc.mini_batches
    rows = math.ceil(rollouts / lc.mini_batches)  # torch.tensor_split: the first mini-batches are the larger
    parts = micro_batches(config, seen, rows)
    length = (f"{seen.prompt_tokens} prompt + {rc.max_new_tokens} completion tokens" if seen.model is not None
              else f"{rc.max_new_tokens} completion tokens (prompt length unknown)")
    lines = [f"model: {config.model.path}: " + (f"{sum(p.numel() for p in seen.model.parameters()) / 1e6:.1f}M "
                                                f"parameters, context {seen.context} tokens" if seen.model is not None
                                                else f"could not be inspected ({seen.why_not}); the numbers below "
                                                     "that need it are left out"),
             f"step: {rc.prompts_per_step} prompts x {rc.group_size} samples = {rollouts} rollouts"
             + (f" (dynamic sampling: up to {config.algorithm.max_extra_rounds} extra rounds)"
                if config.algorithm.dynamic_sampling else ""),
             f"updates per step: {updates} ({lc.ppo_epochs} epochs x {lc.mini_batches} mini-batches of "
             f"up to {rows} rollouts)",
             f"micro-batches per update: at most {len(parts)}, of up to {max(len(p) for p in parts)} rollouts "
             f"({_sizing(config, seen)}; rollouts of {length}; fewer when rows without signal are skipped or "
             "duplicates merged)",
             f"off-policy: {_off_policy(config, updates)}",
             f"sampler: {_sampler(config)}",
             f"numbers: {numbers}",
             f"draws: {_draws(config, mixture)}",
             f"grader down: {_grader_faults(config)}"]
    if seen.model is not None:
        lines += _costs(config, seen, rows, parts, updates)
    lines += [f"warning: {w}" for w in warnings_for(config, seen) + probe_warnings(config, seen, probe)]
    checked = f"a probe of {probe} held-out problems per task" if seen.model is not None and probe > 0 else ""
    lines.append("not checked: sampling time" + ("" if checked else ", whether the model scores 0 on a task")
                 + (f"; tasks scored and answers cut off: by {checked}, temper eval measures them" if checked
                    else " (run temper eval)"))
    return "\n".join(lines)


DRAWS_LATER = {
    "static": "fixed",
    "temperature": "fixed",
    "learnability": "moved as the run measures each task's signal (the variance of success inside its groups)",
    "learning_progress": "moved as the run measures how fast each task's success rate changes",
    "learnability_per_cost": "moved as the run measures each task's signal and its cost per rollout (completion "
                             "tokens x the sampler's seconds per token, plus reward seconds): costs are learned as "
                             "the run goes, not known here",
}
"""What becomes of the first draws under each built-in strategy, for ``temper explain``."""


def _precision(config: TrainConfig, seen: Inspection) -> tuple[TrainConfig, str]:
    """The config as ``precision`` resolves it for the inspected model, and what the run will
    compute in (timing the model once when ``auto`` must and the cache has no measure)."""
    from tempering.policy import resolve_precision

    where = "learner.bf16, rollout.bf16"
    if config.precision is None:
        sides = {"learner": config.learner.bf16, "sampler": config.rollout.bf16}
        return config, (", ".join(f"{side} {'bf16 autocast' if on else 'float32'}" for side, on in sides.items())
                        + f" ({where}; precision=auto chooses for this CPU)")
    if seen.model is None:
        return config, f"precision={config.precision}, decided when the run loads the model"
    config, choice = resolve_precision(config, seen.model)
    return config, f"learner and sampler in {choice.describe()}"


def _draws(config: TrainConfig, mixture: Any) -> str:
    """Each task's expected share of the first step's draws, and what the strategy does with them later."""
    total = sum(mixture.weights)
    shares = ", ".join(f"{task.name} {100 * w / total:.1f}%" for task, w in zip(mixture.tasks, mixture.weights))
    strategy = config.scheduler.strategy
    floor = f", at least {config.scheduler.floor:g} of them by the static weights" if strategy in (
        "learnability", "learning_progress", "learnability_per_cost") else ""
    return (f"{shares} expected at the start (scheduler.strategy={strategy}); "
            f"{DRAWS_LATER[strategy]}{floor}; logged per step as domain/<task>/draw_share")


def _sizing(config: TrainConfig, seen: Inspection) -> str:
    lc = config.learner
    if seen.token_budget:
        source = "learner.token_budget" if lc.token_budget else f"from learner.memory_budget_gb={lc.memory_budget_gb}"
        return f"token budget {seen.token_budget} tokens, {source}"
    if lc.memory_budget_gb:
        return f"learner.memory_budget_gb={lc.memory_budget_gb} sets the budget from the model, not inspected"
    return f"learner.micro_batch_size={lc.micro_batch_size} rows"


def _off_policy(config: TrainConfig, updates: int) -> str:
    pc = config.pipeline
    batch = ("each update's rollouts come from the policy the step started with" if updates == 1 else
             f"update k of {updates} trains on rollouts k-1 updates older than its weights "
             "(clipped importance ratios correct it)")
    if pc.mode == "sync":
        return f"{batch}; pipeline sync: rollouts are sampled by the current policy"
    return (f"{batch}; pipeline async: rollouts up to {pc.max_staleness} policy versions old are trained on (older "
            f"ones dropped, counted as dropped_stale), corrected by pipeline.off_policy={pc.off_policy}"
            + (f" (is_cap {pc.is_cap})" if pc.off_policy == "tis" else ""))


def _sampler(config: TrainConfig) -> str:
    """Which engine samples the rollouts, and the correction for its mismatch with the learner."""
    rc, pc = config.rollout, config.pipeline
    if rc.server is not None and rc.server.launch == "vllm":
        found = "vLLM, launched for the run (rollout.server.launch), weights reloaded from disk every step"
    elif rc.server is not None:
        found = f"the server at {rc.server.url} (reload: {rc.server.reload})"
    elif rc.engine == "vllm":
        found = "vLLM in this process (rollout.engine), weights copied in memory every step"
    else:
        products = {True: "oneDNN's (rollout.onednn=true)", False: "MKL's, as the learner's (rollout.onednn=false)",
                    "auto": f"oneDNN's for models at least {ONEDNN_AUTO_WIDTH} wide, else MKL's as the learner's "
                            "(rollout.onednn=auto)"}[rc.onednn]
        found = (f"the built-in sampler, float32 products {products}; for the tiny model and short steps it is the "
                 "faster engine; for SmolLM2-135M in fp32 it generates 1.1-1.3x faster with oneDNN's products than "
                 "vLLM in-process, and vLLM 1.1-1.5x faster than it with MKL's (docs/vllm.md, when to pick it)")
    if pc.mismatch_correction == "none":
        return found + "; no correction for its mismatch with the learner (pipeline.mismatch_correction)"
    return (found + f"; its mismatch with the learner corrected by pipeline.mismatch_correction="
            f"{pc.mismatch_correction} (ratios kept in [{pc.mismatch_low}, {pc.mismatch_high}])")


def _costs(config: TrainConfig, seen: Inspection, rows: int, parts: list[list[int]], updates: int) -> list[str]:
    """Memory and learner time per step, estimated as the module docstring says."""
    from tempering.build import frozen_parameters, logprob_chunk, resolve_algorithm

    lc = config.learner
    row_tokens = seen.prompt_tokens + config.rollout.max_new_tokens
    micro_tokens = max(learner_tokens(len(p), config.rollout.group_size, seen.prompt_tokens,
                                      config.rollout.max_new_tokens, seen.share_prompts) for p in parts)
    critic = needs_values(resolve_algorithm(config)["advantage"])
    fixed, per_token = memory_costs(seen.model, lc.gradient_checkpointing, logprob_chunk(seen.model, config),
                                    frozen_parameters(seen.model, config, critic))
    tokens = learner_tokens(rows, config.rollout.group_size, seen.prompt_tokens, config.rollout.max_new_tokens,
                            seen.share_prompts)
    seconds = measure_seconds_per_token(seen.model, row_tokens) * tokens * updates
    shared = ", each group's prompt computed once (learner.share_prompts)" if seen.share_prompts else ""
    estimate = fixed + per_token * micro_tokens
    lines = [f"memory: about {estimate / 1024**3:.2f} GB for a learner step (weights, "
            f"gradients, AdamW state, activations of a {micro_tokens}-token micro-batch; an estimate from the "
            "model's shape; a teacher is not counted)",
            f"learner time: about {seconds:.1f} s per step here (one measured forward/backward pass, scaled to "
            f"{updates} x {rows} rollouts of {row_tokens} tokens{shared}; threads {torch.get_num_threads()})"]
    memory = physical_memory_bytes()
    if resolve_device(config.model.device).type == "cpu" and memory and estimate > memory:
        lines.append(f"warning: the learner step's estimate, {estimate / 1024**3:.1f} GB, is more than this "
                     f"machine's {memory / 1024**3:.1f} GB of memory: the run may be killed at its first "
                     "update; set learner.memory_budget_gb (micro-batches sized to fit it) or lower "
                     "learner.micro_batch_size")
    return lines


def physical_memory_bytes() -> int | None:
    """This machine's memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def learner_tokens(rows: int, group_size: int, prompt_tokens: int, completion_tokens: int, shared: bool) -> int:
    """Tokens one update's forward and backward passes run over: every row's prompt and
    completion, or with ``shared`` prompts each group's prompt once and every row's completion.

    >>> learner_tokens(16, 8, 100, 20, shared=False), learner_tokens(16, 8, 100, 20, shared=True)
    (1920, 520)
    """
    if not shared:
        return rows * (prompt_tokens + completion_tokens)
    return -(-rows // group_size) * prompt_tokens + rows * completion_tokens


def _grader_faults(config: TrainConfig) -> str:
    """What the run does when a grader stops answering: one domain's is paused (with several
    trainable tasks and scheduler.pause_failing), every domain's is the whole-run outage."""
    sc, rc = config.scheduler, config.rewards
    outage = (f"a round whose every rollout the rewards dropped is sampled again up to {rc.max_outage_rounds} "
              f"times (waits from {rc.outage_backoff_s:g} s, doubling), then the run stops with a checkpoint")
    if not sc.pause_failing or sum(t.weight > 0 for t in config.tasks) < 2:
        return outage
    return (f"a task whose grader drops a whole round is paused (no draws, its share to the others) and probed "
            f"after {sc.probe_rounds} round(s), then at waits doubling up to {sc.max_probe_rounds}, while the "
            f"others train; with no task left to draw from, {outage}")
