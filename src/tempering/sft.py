"""``temper sft``: supervised fine-tuning on answer tokens, into a run folder like ``temper train``'s.

load the model (with LoRA adapters when ``model.lora`` is set) -> encode and split the records
(``tempering.tasks.sft_records``) -> held-out loss -> steps of about ``sft.batch_tokens`` tokens, each
the token-mean negative log-likelihood of its answer tokens -> checkpoints -> held-out loss
-> save.

Records are packed several to a row with position ids that restart at each record, so none
attends to another (``tempering.learner.packing``, through ``tempering.learner.forward``, the
learner's own log-probs); the loss is the same as with one padded row each, up to
floating-point summation order.

The run folder is ``temper train``'s: ``config.yaml``, ``metrics.jsonl`` (a record per step),
``summary.json`` (``heldout_loss_before`` and ``heldout_loss_after``), ``checkpoint-final/``
and ``checkpoints/step-N/`` in ``tempering.checkpoint``'s format, so the final model is a
``model.path`` for ``temper train`` and ``temper eval``. ``--resume`` continues exactly: the
steps are a pure function of the seed (``tempering.tasks.sft_records.plan_steps``), and the optimizer,
schedule, RNG and any adapter weights are in the checkpoint.

Not done here: evaluating task accuracy (run ``temper eval`` on the checkpoint), sequence
lengths beyond one row (a record longer than ``sft.max_length`` is refused or skipped).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from tempering import checkpoint, faults
from tempering.build import logprob_chunk
from tempering.config import ConfigError, TrainConfig
from tempering.learner.forward import forward_logprobs
from tempering.learner.optim import adamw, guarded_step, lr_factor
from tempering.learner.packing import plan_micro_batches
from tempering.learner.plan import Layout
from tempering.models.compat import enable_checkpointing
from tempering.models.lora import adapter_state, load_adapter_state
from tempering.policy import load_model, resolve_precision, saves_merged, with_lora
from tempering.reporting.metrics import MetricsWriter
from tempering.rollout.prompts import use_chat_template
from tempering.tasks.dataset import DatasetError
from tempering.tasks.sft_records import Example, encode_all, load_split, plan_steps
from tempering.threads import ThreadGovernor


@dataclass(frozen=True)
class Passes:
    """How examples become forward passes (from the config's sft and learner sections)."""

    pad_id: int
    packing: bool
    micro_batch_tokens: int
    """Tokens per pass (rows x width); 0 = every example given at once."""
    chunk: int
    """Tokens of logits at a time; 0 = the model's whole logits."""
    bf16: bool


def example_tensors(examples: list[Example], pad_id: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """``(input_ids_BT, attention_mask_BT, answer_BT)`` of right-padded rows, one example each."""
    width = max(len(e.ids) for e in examples)
    input_ids_BT = torch.tensor([e.ids + [pad_id] * (width - len(e.ids)) for e in examples], device=device)
    attention_BT = torch.tensor([[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in examples], device=device)
    answer_BT = torch.tensor([e.answer_mask + [0] * (width - len(e.ids)) for e in examples], device=device)
    return input_ids_BT, attention_BT, answer_BT


def answer_nll(model: Any, examples: list[Example], passes: Passes, backward_scale: float = 0.0) -> float:
    """The summed negative log-likelihood of the examples' answer tokens, pass by pass; with
    ``backward_scale`` each pass's sum times it is back-propagated (gradients accumulate)."""
    device = next(model.parameters()).device
    lengths = [len(e.ids) for e in examples]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if passes.bf16 else nullcontext()
    total = 0.0
    for rows in plan_micro_batches(lengths, passes.micro_batch_tokens, passes.packing, len(examples)):
        input_ids_BT, attention_BT, answer_BT = example_tensors([examples[i] for i in rows], passes.pad_id, device)
        with autocast:
            logprobs_BT = forward_logprobs(model, input_ids_BT, attention_BT, keep_BT=answer_BT,
                                           layout=Layout.PACKED if passes.packing else Layout.PADDED,
                                           chunk=passes.chunk).logprobs_BT
        nll = -(logprobs_BT.float() * answer_BT).sum()
        if backward_scale:
            (nll * backward_scale).backward()
        total += float(nll.detach())
    return total


def answer_tokens(examples: list[Example]) -> int:
    return sum(sum(e.answer_mask) for e in examples)


@torch.no_grad()
def heldout_loss(model: Any, examples: list[Example], passes: Passes, batch_tokens: int) -> float:
    """Token-mean negative log-likelihood of the answer tokens of ``examples``."""
    model.eval()
    lengths = [len(e.ids) for e in examples]
    total = sum(answer_nll(model, [examples[i] for i in rows], passes)
                for rows in plan_micro_batches(lengths, batch_tokens, passes.packing, len(examples)))
    return total / answer_tokens(examples)


def sft_step(model: Any, optimizer: torch.optim.Optimizer, examples: list[Example], passes: Passes,
             grad_clip: float) -> dict[str, float]:
    """One optimizer update on the token-mean loss of ``examples``' answer tokens; an update
    whose loss or gradient is not finite is skipped (``skipped_updates``)."""
    model.train()
    count = answer_tokens(examples)
    loss = answer_nll(model, examples, passes, backward_scale=1.0 / count) / count
    faults.point("learn")
    grad_norm, stepped = guarded_step(optimizer, loss, grad_clip)
    model.eval()
    return {"loss": loss, "grad_norm": grad_norm, "answer_tokens": count,
            "tokens": sum(len(e.ids) for e in examples), "skipped_updates": 0 if stepped else 1}


@dataclass
class Data:
    train: list[Example]
    heldout: list[Example]
    skipped: int
    """Records left out for being over ``sft.max_length``."""


def read_data(config: TrainConfig) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """The training and held-out records, each checked; a bad file or record is a ConfigError naming it."""
    sc = config.sft
    if not sc.data:
        raise ConfigError("sft.data: no training records given; run `temper sft DATA.jsonl`")
    try:
        return load_split(sc.data, sc.eval_path, sc.eval_fraction)
    except DatasetError as exc:
        raise ConfigError(str(exc)) from None


def encode_data(config: TrainConfig, records: tuple[list, list], tokenizer: Any, context: int) -> Data:
    """The records as token ids and answer masks (over-long ones refused or skipped)."""
    sc = config.sft
    template = use_chat_template(tokenizer, config.model.chat_template)
    limit = sc.max_length or context
    train_records, heldout_records = records
    try:
        train, skipped = encode_all(train_records, tokenizer, template, limit, sc.long_records)
        heldout, skipped_heldout = encode_all(heldout_records, tokenizer, template, limit, sc.long_records)
    except DatasetError as exc:
        raise ConfigError(str(exc)) from None
    return Data(train, heldout, skipped + skipped_heldout)


def sft(config: TrainConfig, progress: bool = True, resume: bool = False) -> dict:
    """Fine-tune as ``config.sft`` says; return the summary also written to ``summary.json``."""
    start = time.perf_counter()
    sc = config.sft
    threads = ThreadGovernor(config.threads)
    torch.manual_seed(config.seed)
    records = read_data(config)  # everything that can be refused before the model is loaded
    checkpoint.check_run_dir(config.run_dir, resume)
    model, tokenizer, model_path = load_model(config, config.model.path, progress)
    config, _ = resolve_precision(config, model)
    model = with_lora(config, model)
    data = encode_data(config, records, tokenizer, getattr(model.config, "max_position_embeddings", 0) or 0)
    if config.learner.gradient_checkpointing:
        enable_checkpointing(model)
    lc = config.learner
    passes = Passes(tokenizer.pad_token_id, sc.packing, sc.micro_batch_tokens, logprob_chunk(model, config), lc.bf16)
    steps = plan_steps([len(e.ids) for e in data.train], sc.batch_tokens, sc.epochs, config.seed)
    optimizer = adamw(model, sc.lr, lc.betas, sc.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, sc.warmup_steps, len(steps), sc.schedule, sc.min_lr_ratio))
    folder = checkpoint.open_run(config.run_dir, resume)
    run_dir = folder.path
    first_step, loss_before = folder.start(config, lambda found: restore(found, model, optimizer, schedule)) or (0, None)
    if loss_before is None:
        loss_before = heldout_loss(model, data.heldout, passes, sc.batch_tokens)

    metrics = MetricsWriter(run_dir / "metrics.jsonl")
    bar = tqdm(total=len(steps), initial=first_step, desc="sft", disable=not progress, dynamic_ncols=True)
    try:
        for step in range(first_step, len(steps)):
            t0 = time.perf_counter()
            lr = optimizer.param_groups[0]["lr"]
            record = sft_step(model, optimizer, [data.train[i] for i in steps[step]], passes, sc.grad_clip)
            schedule.step()
            record.update(step=step + 1, lr=lr, step_s=time.perf_counter() - t0, **threads.update())
            metrics.write(record)
            every = config.checkpoint.every
            if every and ((step + 1) % every == 0 or step + 1 == len(steps)):
                state = {"step": step + 1, "optimizer": optimizer.state_dict(), "scheduler": schedule.state_dict(),
                         "adapter": adapter_state(model), "loss_before": loss_before,
                         "rng": checkpoint.rng_state()}
                checkpoint.save(run_dir, step + 1, model, tokenizer, state, config.checkpoint.keep, saves_merged(config))
            bar.set_postfix(loss=f"{record['loss']:.3f}")
            bar.update()
    finally:
        bar.close()
        metrics.close()

    loss_after = heldout_loss(model, data.heldout, passes, sc.batch_tokens)
    final = run_dir / checkpoint.FINAL_MODEL
    checkpoint.save_model(model, tokenizer, final, saves_merged(config))
    summary = {
        "heldout_loss_before": loss_before, "heldout_loss_after": loss_after, "steps": len(steps),
        "epochs": sc.epochs, "train_records": len(data.train), "heldout_records": len(data.heldout),
        "skipped_records": data.skipped, "answer_tokens_per_epoch": answer_tokens(data.train),
        "wall_s": time.perf_counter() - start, "model": model_path, "checkpoint": str(final),
        "resumed_from": first_step if resume else None,
    }
    folder.finish(summary)
    if progress:
        print(f"held-out loss (token-mean NLL of answer tokens, {len(data.heldout)} records): "
              f"before {loss_before:.4f}  after {loss_after:.4f}")
        print(f"run folder: {run_dir}  ({summary['wall_s']:.0f} s)")
    return summary


def restore(path: Path, model: Any, optimizer: torch.optim.Optimizer, schedule: Any) -> tuple[int, float]:
    """Load a checkpoint into the freshly built model and optimizer; return its step and the
    held-out loss measured before training."""
    state = checkpoint.load_state(path)
    checkpoint.load_model_weights(model, path)
    if state["adapter"] is not None:
        load_adapter_state(model, state["adapter"])
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["scheduler"])
    checkpoint.restore_rng(state["rng"])
    return state["step"], state["loss_before"]
