"""``temper dpo``: offline preference optimisation (DPO, IPO, SimPO, KTO), into a run folder like ``temper sft``'s.

read and check the records (``tempering.tasks.preference_records``; before the model loads) ->
load the policy (with LoRA adapters when ``model.lora`` is set) -> encode each completion as
prompt + completion tokens -> the reference's sequence log-probs of every record, once
(``dpo.reference=precompute``), or each step from a frozen copy (``model``) -> held-out
preference metrics (and greedy task accuracy) -> steps of ``dpo.batch_size`` pairs, each the
mean of the loss (``tempering.algorithms.preference``) -> checkpoints -> held-out metrics -> save.

The reference model is the policy as loaded. With LoRA it is the policy with its adapters
switched off, so no copy is ever made; without LoRA, ``precompute`` runs the policy once before
its first step and keeps only the numbers, and ``model`` keeps a frozen copy. SimPO uses none.
Log-probs are the learner's own (``tempering.learner.forward``): prompt and completion in one
row, log-probs of the completion tokens only, packed rows when ``learner.packing``.

KTO's KL reference point (``tempering.algorithms.preference.kto_kl``) is estimated as TRL does
it: each training example's prompt with the completion of the example before it in its
run of ``dpo.batch_size`` examples in file order (the first with the last), under the policy
(no gradient) and the reference.

The run folder is ``temper sft``'s: ``config.yaml``, ``metrics.jsonl`` (a record per step:
``loss``, ``rewards/chosen``, ``rewards/rejected``, ``margin``, ``accuracy`` (pairs only),
``grad_norm``, ``lr``), ``summary.json`` (held-out loss, accuracy and margin before and after,
and greedy task accuracy when measured), ``checkpoint-final/`` and ``checkpoints/step-N/``.
``--resume`` continues exactly: the steps are a pure function of the seed, and the optimizer,
schedule, RNG, adapters, precomputed reference log-probs and the measurements before training
are in the checkpoint.

Not done here: truncating long records (they are refused), several GPUs, generating pairs
online (that is RL's ``algorithm.loss`` side).
"""

from __future__ import annotations

import copy
import functools
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from tqdm import tqdm

from tempering import checkpoint, faults
from tempering.algorithms.preference import PREFERENCE_LOSSES, PairInputs, UnpairedInputs, kto_kl, sequence_logprobs
from tempering.build import build_tasks, local_generator, logprob_chunk
from tempering.config import ConfigError, TrainConfig
from tempering.eval.greedy import evaluate
from tempering.learner.forward import forward_logprobs
from tempering.learner.optim import adamw, guarded_step, lr_factor
from tempering.learner.plan import Layout
from tempering.models.compat import enable_checkpointing
from tempering.models.lora import adapter_state, adapters_off, load_adapter_state
from tempering.policy import load_model, resolve_precision, saves_merged, with_lora
from tempering.registry import add, resolve
from tempering.reporting.metrics import MetricsWriter
from tempering.rollout.prompts import use_chat_template
from tempering.sft import Passes, example_tensors
from tempering.tasks.preference_records import (BUILTIN_ARITHMETIC, PreferenceRecord, arithmetic_mistake_pairs,
                                                completion_turns, read_preferences, sft_record, split, unpair)
from tempering.tasks.records import DatasetError
from tempering.tasks.sft_records import Example, encode_record
from tempering.threads import ThreadGovernor


@dataclass(frozen=True)
class Item:
    """What one loss term looks at: a pair's chosen and rejected rows, or an unpaired example's
    row and its KL row (``desirable`` set)."""

    first: int
    second: int
    desirable: Optional[bool] = None


@dataclass
class Data:
    rows: list[Example]
    """Every encoded prompt + completion, indexed by the items."""
    train: list[Item]
    heldout: list[Item]


def resolve_loss(name: str) -> Callable:
    """The loss ``dpo.loss`` names; a ``module:function`` plug-in that does not say otherwise (its
    own ``paired`` and ``reference`` attributes) is taken to learn from pairs with a reference."""
    try:
        loss = resolve(PREFERENCE_LOSSES, name, "preference loss")
    except ValueError as exc:
        raise ConfigError(f"dpo.loss: {exc}") from None
    if hasattr(loss, "paired") and hasattr(loss, "reference"):
        return loss
    return add({}, "preference loss", name, functools.wraps(loss)(lambda inputs: loss(inputs)),
               paired=getattr(loss, "paired", True), reference=getattr(loss, "reference", True))


def read_data(config: TrainConfig, paired: bool) -> tuple[list[PreferenceRecord], list[PreferenceRecord]]:
    """The training and held-out records, checked; a bad file or record is a ConfigError naming it."""
    dc = config.dpo
    if not dc.pairs:
        raise ConfigError("dpo.pairs: no preference records given; run `temper dpo PAIRS.jsonl` "
                          f"(or `temper dpo {BUILTIN_ARITHMETIC}`)")
    try:
        if dc.pairs == BUILTIN_ARITHMETIC:
            records = arithmetic_mistake_pairs(build_tasks(config), dc.builtin_pairs)
        else:
            records = read_preferences(dc.pairs)
        heldout = read_preferences(dc.eval_path) if dc.eval_path else None
        single = next((r for r in records + (heldout or []) if not r.paired), None) if paired else None
        if single is not None:
            raise ConfigError(f"{single.where}: an unpaired record (prompt, completion, label), but dpo.loss="
                              f"{dc.loss} learns from pairs; give pairs or set dpo.loss=kto")
        train, heldout = split(records, heldout, dc.eval_fraction)
    except DatasetError as exc:
        raise ConfigError(str(exc)) from None
    if paired:
        return train, heldout
    return unpair(train), unpair(heldout)


def _last_turns(mask: list[int], turns: int) -> list[int]:
    """``mask`` with only its last ``turns`` runs of ones kept: the completion's, not the
    assistant turns a conversational prompt holds."""
    starts = [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]
    keep_from = starts[-turns] if len(starts) >= turns else 0
    return [0] * keep_from + mask[keep_from:]


class Encoder:
    """Records into rows of token ids whose answer mask covers the completion only."""

    def __init__(self, tokenizer: Any, chat_template: bool, max_length: int):
        self.tokenizer, self.chat_template, self.max_length = tokenizer, chat_template, max_length
        self.rows: list[Example] = []

    def add(self, where: str, prompt: Any, completion: Any) -> int:
        example = encode_record(where, sft_record(prompt, completion), self.tokenizer, self.chat_template)
        if self.max_length and len(example.ids) > self.max_length:
            raise DatasetError(f"{where}: the record is {len(example.ids)} tokens, over dpo.max_length="
                               f"{self.max_length} (0 = the model's context); shorten it or raise dpo.max_length")
        mask = _last_turns(example.answer_mask, completion_turns(completion))
        self.rows.append(Example(example.ids, mask, where))
        return len(self.rows) - 1

    def items(self, records: list[PreferenceRecord], run: int) -> list[Item]:
        """A pair's two rows; an unpaired example's row and its KL row: its prompt with the
        completion of the example before it in its run of ``run`` examples (the first takes the last)."""
        items = []
        for i, r in enumerate(records):
            if r.paired:
                items.append(Item(self.add(r.where, r.prompt, r.chosen), self.add(r.where, r.prompt, r.rejected)))
                continue
            start = i - i % run
            end = min(start + run, len(records))
            other = records[end - 1] if i == start else records[i - 1]
            items.append(Item(self.add(r.where, r.prompt, r.chosen), self.add(r.where, r.prompt, other.chosen),
                              r.desirable))
        return items


def encode_data(config: TrainConfig, records: tuple[list, list], tokenizer: Any, context: int) -> Data:
    template = use_chat_template(tokenizer, config.model.chat_template)
    encoder = Encoder(tokenizer, template, config.dpo.max_length or context)
    try:
        train = encoder.items(records[0], config.dpo.batch_size)
        heldout = encoder.items(records[1], config.dpo.batch_size)
    except DatasetError as exc:
        raise ConfigError(str(exc)) from None
    return Data(encoder.rows, train, heldout)


def row_logprobs(model: Any, rows: list[Example], passes: Passes) -> tuple[torch.Tensor, torch.Tensor]:
    """``(summed log-prob, token count)`` of each row's completion tokens, in one pass."""
    device = next(model.parameters()).device
    input_ids_BT, attention_BT, answer_BT = example_tensors(rows, passes.pad_id, device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if passes.bf16 else nullcontext()
    with autocast:
        logprobs_BT = forward_logprobs(model, input_ids_BT, attention_BT, keep_BT=answer_BT,
                                       layout=Layout.PACKED if passes.packing else Layout.PADDED,
                                       chunk=passes.chunk).logprobs_BT
    return sequence_logprobs(logprobs_BT.float(), answer_BT)


@torch.no_grad()
def logprobs_of(model: Any, data: Data, indices: list[int], passes: Passes, per_pass: int) -> torch.Tensor:
    """A table over all of ``data.rows`` holding the summed completion log-probs of ``indices``
    (0 elsewhere), ``per_pass`` rows a pass."""
    table_R = torch.zeros(len(data.rows))
    for start in range(0, len(indices), per_pass):
        chunk = indices[start:start + per_pass]
        table_R[chunk] = row_logprobs(model, [data.rows[i] for i in chunk], passes)[0].cpu()
    return table_R


@dataclass
class Reference:
    """The reference log-probs: a table made once, or a frozen model run when asked."""

    model: Any
    """The reference model (with LoRA: the policy, run with its adapters off)."""
    table_R: Optional[torch.Tensor] = None

    def logps(self, data: Data, indices: list[int], passes: Passes, per_pass: int) -> torch.Tensor:
        if self.table_R is not None:
            return self.table_R
        with adapters_off(self.model):
            return logprobs_of(self.model, data, indices, passes, per_pass)


@dataclass
class Objective:
    """The loss and what it is given besides log-probs (plain values from the config)."""

    loss: Callable
    options: dict[str, float]
    passes: Passes
    micro_batch: int
    """Items per forward/backward pass."""


def _rows(items: list[Item]) -> list[int]:
    return [i.first for i in items] + [i.second for i in items]


def batch_loss(model: Any, data: Data, items: list[Item], objective: Objective, reference: Optional[Reference],
               backward_scale: float = 0.0) -> tuple[float, dict[str, float]]:
    """The mean loss over ``items`` and the mean implicit rewards, micro-batch by micro-batch;
    with ``backward_scale`` each micro-batch's summed loss times it is back-propagated. The
    constants (reference log-probs, KTO's KL point) are computed first, in eval mode."""
    training = model.training
    model.eval()
    per_pass = 2 * objective.micro_batch
    ref_R = reference.logps(data, _rows(items), objective.passes, per_pass) if reference is not None else None
    kl = None
    if not objective.loss.paired:
        kl_rows = [i.second for i in items]
        kl = kto_kl(logprobs_of(model, data, kl_rows, objective.passes, per_pass)[kl_rows], ref_R[kl_rows])
    model.train(training)
    total, chosen, rejected = 0.0, [], []
    for start in range(0, len(items), objective.micro_batch):
        chunk = items[start:start + objective.micro_batch]
        loss_B, rewards = objective.loss(_inputs(model, data, chunk, objective, ref_R, kl))
        if backward_scale:
            (loss_B.sum() * backward_scale).backward()
        total += float(loss_B.detach().sum())
        chosen.append(rewards["rewards/chosen"])
        rejected.append(rewards["rewards/rejected"])
    return total / len(items), _reward_metrics(torch.cat(chosen), torch.cat(rejected), objective.loss.paired)


def _inputs(model: Any, data: Data, chunk: list[Item], objective: Objective, ref_R: Optional[torch.Tensor],
            kl: Optional[torch.Tensor]) -> Any:
    """The loss's inputs for ``chunk``: both rows of each pair, or each example's own row."""
    device = next(model.parameters()).device
    rows = _rows(chunk) if objective.loss.paired else [i.first for i in chunk]
    logps_B, lengths_B = row_logprobs(model, [data.rows[r] for r in rows], objective.passes)
    ref_B = ref_R[rows].to(device) if ref_R is not None else None
    if not objective.loss.paired:
        desirable_B = torch.tensor([i.desirable for i in chunk], device=device)
        return UnpairedInputs(logps_B, ref_B, desirable_B, kl.to(device), **objective.options)
    n = len(chunk)
    return PairInputs(logps_B[:n], logps_B[n:], lengths_B[:n], lengths_B[n:],
                      None if ref_B is None else ref_B[:n], None if ref_B is None else ref_B[n:], **objective.options)


def _reward_metrics(chosen_B: torch.Tensor, rejected_B: torch.Tensor, paired: bool) -> dict[str, float]:
    """Mean rewards, their margin, and for pairs the share whose chosen reward is the higher."""
    def mean(values: torch.Tensor) -> float:
        return float(values.mean()) if len(values) else 0.0

    metrics = {"rewards/chosen": mean(chosen_B), "rewards/rejected": mean(rejected_B)}
    metrics["margin"] = metrics["rewards/chosen"] - metrics["rewards/rejected"]
    if paired:
        metrics["accuracy"] = mean((chosen_B > rejected_B).float())
    return metrics


def dpo_step(model: Any, optimizer: torch.optim.Optimizer, data: Data, items: list[Item], objective: Objective,
             reference: Optional[Reference], grad_clip: float) -> dict[str, float]:
    """One optimizer update on the mean loss of ``items``; one whose loss or gradient is not
    finite is skipped (``skipped_updates``)."""
    model.train()
    loss, metrics = batch_loss(model, data, items, objective, reference, backward_scale=1.0 / len(items))
    faults.point("learn")
    grad_norm, stepped = guarded_step(optimizer, loss, grad_clip)
    model.eval()
    tokens = sum(len(data.rows[r].ids) for r in _rows(items))
    return {"loss": loss, **metrics, "grad_norm": grad_norm, "tokens": tokens, "skipped_updates": 0 if stepped else 1}


@torch.no_grad()
def heldout_metrics(model: Any, data: Data, objective: Objective, reference: Optional[Reference]) -> dict[str, float]:
    """The held-out loss and reward metrics, every held-out item at once."""
    model.eval()
    loss, metrics = batch_loss(model, data, data.heldout, objective, reference)
    return {"loss": loss, **metrics}


def plan_steps(count: int, batch_size: int, epochs: int, seed: int) -> list[list[int]]:
    """Item indices of every optimizer step: each epoch a fresh seeded order cut into runs of
    ``batch_size``. A pure function of its arguments, so a resumed run finds its place by the step.

    >>> plan_steps(5, 2, 2, seed=0)
    [[2, 4], [0, 1], [3], [0, 4], [2, 3], [1]]
    """
    steps = []
    for epoch in range(epochs):
        order = list(range(count))
        random.Random(f"dpo:{seed}:{epoch}").shuffle(order)
        steps += [order[start:start + batch_size] for start in range(0, count, batch_size)]
    return steps


def frozen_reference(config: TrainConfig, model: Any, loss: Callable) -> Optional[Any]:
    """A frozen copy of the policy as loaded, for ``dpo.reference=model`` without LoRA; None
    otherwise (the policy itself serves: run once before training for ``precompute``, or with
    its adapters off under LoRA; SimPO needs none)."""
    if not loss.reference or config.dpo.reference != "model" or config.model.lora is not None:
        return None
    frozen = copy.deepcopy(model).eval()
    frozen.requires_grad_(False)
    return frozen


def greedy_accuracy(config: TrainConfig, model: Any, tokenizer: Any, progress: bool) -> Optional[dict]:
    """Greedy held-out accuracy on the config's tasks, when ``dpo.evaluate`` asks for it."""
    wanted = config.dpo.evaluate if config.dpo.evaluate is not None else config.dpo.pairs == BUILTIN_ARITHMETIC
    if not wanted:
        return None
    ec = config.eval
    generator = local_generator(config, model, tokenizer, ec.batch_size)
    result = evaluate(generator, build_tasks(config), ec.problems_per_task, ec.max_new_tokens, config.rewards.options,
                      progress=progress, stop=config.rollout.stop)
    return {"accuracy": result["accuracy"], "per_task": result["per_task"], "problems": result["problems"]}


def dpo(config: TrainConfig, progress: bool = True, resume: bool = False) -> dict:
    """Optimise the policy on preferences as ``config.dpo`` says; return the summary also
    written to ``summary.json``."""
    start = time.perf_counter()
    dc, lc = config.dpo, config.learner
    threads = ThreadGovernor(config.threads)
    torch.manual_seed(config.seed)
    loss = resolve_loss(dc.loss)
    records = read_data(config, loss.paired)  # everything that can be refused before the model is loaded
    checkpoint.check_run_dir(config.run_dir, resume)
    model, tokenizer, model_path = load_model(config, config.model.path, progress)
    config, _ = resolve_precision(config, model)
    lc = config.learner
    frozen = frozen_reference(config, model, loss)
    model = with_lora(config, model)
    reference = Reference(model if frozen is None else frozen) if loss.reference else None
    data = encode_data(config, records, tokenizer, getattr(model.config, "max_position_embeddings", 0) or 0)
    if lc.gradient_checkpointing:
        enable_checkpointing(model)
    passes = Passes(tokenizer.pad_token_id, lc.packing, 0, logprob_chunk(model, config), lc.bf16)
    options = ({"beta": dc.beta, "label_smoothing": dc.label_smoothing, "gamma": dc.gamma} if loss.paired else
               {"beta": dc.beta, "desirable_weight": dc.desirable_weight, "undesirable_weight": dc.undesirable_weight})
    objective = Objective(loss, options, passes, dc.micro_batch_size or dc.batch_size)
    steps = plan_steps(len(data.train), dc.batch_size, dc.epochs, config.seed)
    optimizer = adamw(model, dc.lr, lc.betas, dc.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, dc.warmup_steps, len(steps), dc.schedule, dc.min_lr_ratio))
    folder = checkpoint.open_run(config.run_dir, resume)
    run_dir = folder.path
    first_step, table_R, before = folder.start(
        config, lambda found: restore(found, model, optimizer, schedule)) or (0, None, None)
    if reference is not None and dc.reference == "precompute":
        if table_R is None:
            table_R = _precompute(reference, data, objective, progress)
        reference = Reference(None, table_R)
    if before is None:
        before = {"heldout": heldout_metrics(model, data, objective, reference),
                  "greedy": greedy_accuracy(config, model, tokenizer, progress)}

    metrics = MetricsWriter(run_dir / "metrics.jsonl")
    bar = tqdm(total=len(steps), initial=first_step, desc=f"dpo ({dc.loss})", disable=not progress, dynamic_ncols=True)
    try:
        for step in range(first_step, len(steps)):
            t0 = time.perf_counter()
            lr = optimizer.param_groups[0]["lr"]
            record = dpo_step(model, optimizer, data, [data.train[i] for i in steps[step]], objective, reference,
                              dc.grad_clip)
            schedule.step()
            record.update(step=step + 1, lr=lr, step_s=time.perf_counter() - t0, **threads.update())
            metrics.write(record)
            every = config.checkpoint.every
            if every and ((step + 1) % every == 0 or step + 1 == len(steps)):
                state = {"step": step + 1, "optimizer": optimizer.state_dict(), "scheduler": schedule.state_dict(),
                         "adapter": adapter_state(model), "reference": table_R, "before": before,
                         "rng": checkpoint.rng_state()}
                checkpoint.save(run_dir, step + 1, model, tokenizer, state, config.checkpoint.keep,
                                saves_merged(config))
            bar.set_postfix(loss=f"{record['loss']:.3f}", margin=f"{record['margin']:.2f}")
            bar.update()
    finally:
        bar.close()
        metrics.close()

    after = {"heldout": heldout_metrics(model, data, objective, reference),
             "greedy": greedy_accuracy(config, model, tokenizer, progress)}
    final = run_dir / checkpoint.FINAL_MODEL
    checkpoint.save_model(model, tokenizer, final, saves_merged(config))
    summary = {
        "loss": dc.loss, "heldout_before": before["heldout"], "heldout_after": after["heldout"],
        "greedy_before": before["greedy"], "greedy_after": after["greedy"], "steps": len(steps), "epochs": dc.epochs,
        "train_items": len(data.train), "heldout_items": len(data.heldout),
        "reference": dc.reference if loss.reference else None,
        "wall_s": time.perf_counter() - start, "model": model_path, "checkpoint": str(final),
        "resumed_from": first_step if resume else None,
    }
    folder.finish(summary)
    if progress:
        _print_summary(summary, run_dir)
    return summary


def _precompute(reference: Reference, data: Data, objective: Objective, progress: bool) -> torch.Tensor:
    """The reference log-probs of every row, once, before the first step."""
    per_pass = 2 * objective.micro_batch
    table_R = torch.zeros(len(data.rows))
    starts = range(0, len(data.rows), per_pass)
    for start in tqdm(starts, desc="reference log-probs", disable=not progress, leave=False):
        table_R += reference.logps(data, list(range(start, min(start + per_pass, len(data.rows)))), objective.passes,
                                   per_pass)
    return table_R


def _print_summary(summary: dict, run_dir: Path) -> None:
    before, after = summary["heldout_before"], summary["heldout_after"]
    line = f"held-out ({summary['heldout_items']}): loss {before['loss']:.4f} -> {after['loss']:.4f}"
    if "accuracy" in after:
        line += f", reward accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}"
    print(line + f", margin {before['margin']:.3f} -> {after['margin']:.3f}")
    if summary["greedy_after"] is not None:
        print(f"greedy task accuracy: {summary['greedy_before']['accuracy']:.3f} -> "
              f"{summary['greedy_after']['accuracy']:.3f}")
    print(f"run folder: {run_dir}  ({summary['wall_s']:.0f} s)")


def restore(path: Path, model: Any, optimizer: torch.optim.Optimizer, schedule: Any
            ) -> tuple[int, Optional[torch.Tensor], dict]:
    """Load a checkpoint into the freshly built model and optimizer; return its step, the
    precomputed reference log-probs and the measurements before training."""
    state = checkpoint.load_state(path)
    checkpoint.load_model_weights(model, path)
    if state["adapter"] is not None:
        load_adapter_state(model, state["adapter"])
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["scheduler"])
    checkpoint.restore_rng(state["rng"])
    return state["step"], state["reference"], state["before"]
