"""Learner and sampler memory and seconds per token against context length, with the longest length the learner trains in a memory budget beside TRL's; prints one JSON object.

    python bench/long_context.py [--models builtin:smollm2] [--lengths 1024,2048,4096,8192,16384]
                                 [--micro-batch-tokens 16384] [--new-tokens 8] [--growth-from 2048]
                                 [--budget-gb 8] [--trl-lengths 1024,2048,4096,8192,16384] [--save DIR]

For each model of ``--models`` (``builtin:`` names or model folders, comma-separated), each
measurement runs in a fresh process (``bench/memory.py``'s children and its watcher, which
stops a child past the budget), fp32, one thread:

- learner, at each length L: one ``Learner.step`` (forward, backward, AdamW; gradient
  checkpointing, packing, log-probs 1024 tokens at a time) on a fixed micro-batch of
  ``--micro-batch-tokens`` tokens: that many // L sequences of L tokens (a 64-token prompt,
  the rest trained), so every length trains the same number of tokens and what changes with
  L is only what attention costs. Peak RSS of the step (the resident model, gradients and
  optimizer state included) and the step's seconds per token.
- sampler, at each length L: the built-in sampler (``HFGenerator``) drawing ``--new-tokens``
  tokens after one L-token prompt (end-of-sequence ignored): peak RSS, prefill seconds (to the
  first token) per prompt token and decoding seconds per generated token after it.
- ``learner_growth``: the learner's peak at the longest length over its peak at
  ``--growth-from`` (the aim: at most 1.5 from 2k to 16k).
- ``max_trainable``: ``bench/memory.py``'s ladder on ``--trl-lengths``, one sequence per
  step, tempering and TRL's ``GRPOTrainer`` each in a fresh process, stopping a side at its
  first length over ``--budget-gb``; the longest each trains within it and their ratio, also in
  ``ratios`` for ``bench/report.py`` (``at_least`` where tempering's longest is the ladder's top).

``attention`` names the model's attention implementation (transformers' ``sdpa``) and the
kernels torch ran for it in a short probe of the learner's forward and backward after each
measured step (``torch.profiler``, on at most 256 tokens): on CPU, SDPA's
flash kernel (``_scaled_dot_product_flash_attention_for_cpu``, memory linear in length), or
the math fallback where it cannot (quadratic). Lengths past a model's position limit run with
the limit raised to the length (``memory.load_for_length``: RoPE computes every position's
angles, so memory and time are what they would be; what the model would make of such text is
not measured) and are listed in ``beyond_position_limit``: SmolLM2-135M as converted from
its GGUF has 8192 positions, so 16384 is beyond it. A model built with longer positions
(a ``builtin:`` name that pre-trains one) needs only its name in ``--models``.

Not measured: GPU memory (this bench reads the process's RSS on CPU), bf16, sequences split
over several micro-batches (context parallelism), and the sampler with many rows at once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from memory import (CHUNK, PROMPT, checked_limit, ladder, length_list, load_for_length, model_label, peak_kb,
                    ratios, reset_peak, run_child, run_script, sequences, tempering_step)
from report import measured, save

SDPA_KERNELS = "scaled_dot_product"
PROBE = 256


def attention_kernels(model, length: int) -> list[str]:
    """The attention kernels torch runs, forward and backward, for the learner's log-probs
    (``forward_logprobs``, as ``Learner.step`` computes them) on one ``length``-token row, by
    the profiler's names."""
    from torch.profiler import ProfilerActivity, profile

    from tempering.learner.forward import forward_logprobs

    ids_BT = sequences(model.config.vocab_size, 1, length)
    with profile(activities=[ProfilerActivity.CPU]) as trace:
        forward_logprobs(model, ids_BT, torch.ones_like(ids_BT), chunk=CHUNK).logprobs_BT.sum().backward()
    model.zero_grad(set_to_none=True)
    return sorted({event.key for event in trace.key_averages() if SDPA_KERNELS in event.key})


def learner_child(model_path: str, length: int, micro_batch_tokens: int) -> dict:
    """The learner step's peak and seconds per token, then (after the measured step) the
    attention kernels it ran, probed on a row of at most :data:`PROBE` tokens."""
    rows = max(1, micro_batch_tokens // length)
    result = tempering_step(model_path, length, bf16=False, rows=rows,
                            then=lambda model: {"kernels": attention_kernels(model, min(length, PROBE))})
    return {**result, "rows": rows, "s_per_token": result["step_s"] / result["tokens"]}


def sampler_child(model_path: str, length: int, new_tokens: int) -> dict:
    from tempering.rollout.base import SamplingParams
    from tempering.rollout.hf import HFGenerator

    model, tokenizer = load_for_length(model_path, length + new_tokens)
    sampler = HFGenerator(model, tokenizer, batch_size=1)
    prompt = sequences(model.config.vocab_size, 1, length)[0].tolist()
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    times: list[float] = []
    before = reset_peak()
    start = time.perf_counter()
    sampler.sample_with_alternatives([prompt], params, torch.Generator().manual_seed(0),
                                     on_step=lambda *_: times.append(time.perf_counter()))
    decode_s = times[-1] - times[0]
    return {"before_kb": before, "peak_kb": peak_kb(), "prefill_s": times[0] - start,
            "prefill_s_per_token": (times[0] - start) / length, "new_tokens": len(times),
            "decode_s_per_token": decode_s / (len(times) - 1) if len(times) > 1 else None}


CHILDREN = {"learner": lambda o, n: learner_child(o.model, n, o.micro_batch_tokens),
            "sampler": lambda o, n: sampler_child(o.model, n, o.new_tokens)}
"""What a child measures at length ``n``, by the name ``--child`` gives."""


def sweep(options, model: str, kind: str, budget_kb: int) -> dict:
    """One fresh child per length; a length past the budget is ``{"over_budget": true}`` and ends the sweep."""
    found = {}
    for length in options.lengths:
        command = [sys.executable, __file__, "--child", kind, str(length), "--model", model,
                   "--micro-batch-tokens", str(options.micro_batch_tokens), "--new-tokens", str(options.new_tokens)]
        result = run_child(command, f"the {kind} of {model} at {length} tokens", budget_kb)
        print(f"long_context: {model} {kind} {length}: {result and round(result['peak_mb'])} MB", file=sys.stderr,
              flush=True)
        if result is None:
            found[length] = {"over_budget": True}
            break
        found[length] = {key: value for key, value in result.items() if not key.endswith("_kb")}
    return found


def growth(learner: dict, start: int) -> dict | None:
    """The learner's peak at its longest measured length over its peak at ``start``."""
    peaks = {n: r["peak_mb"] for n, r in learner.items() if "peak_mb" in r}
    if start not in peaks or max(peaks) == start:
        return None
    return {"from": start, "to": max(peaks), "ratio": peaks[max(peaks)] / peaks[start]}


def max_trainable(options, model: str) -> dict:
    found = ladder(["tempering", "trl"], model, options.trl_lengths, False, [options.budget_gb])
    longest = found["max_len"][f"{options.budget_gb:g}"]
    ratio = longest["tempering"] / longest["trl"] if longest["trl"] else None
    return {"budget_gb": options.budget_gb, "lengths": options.trl_lengths, **longest, "ratio": ratio,
            "at_least": longest["tempering"] == max(options.trl_lengths), "peak_mb": found["peak_mb"]}


def one_model(options, model: str, limit: int) -> dict:
    budget_kb = int(options.budget_gb * 1024 * 1024)
    learner = sweep(options, model, "learner", budget_kb)
    kernels = sorted({kernel for result in learner.values() for kernel in result.get("kernels", [])})
    return {"model": model, "position_limit": limit,
            "beyond_position_limit": [n for n in options.lengths if n > limit],
            "attention": {"implementation": next(iter(learner.values())).get("attention"), "kernels": kernels},
            "learner": learner, "learner_growth": growth(learner, options.growth_from),
            "sampler": sweep(options, model, "sampler", budget_kb),
            "max_trainable": max_trainable(options, model) if options.trl_lengths else None}


def ratio_rows(results: dict) -> list[dict]:
    """Each model's ``max_trainable`` as ``bench/memory.py`` words its ratios (for ``bench/report.py``)."""
    rows = []
    for label, result in results.items():
        best = result["max_trainable"]
        if best:
            longest = {f"{best['budget_gb']:g}": {"tempering": best["tempering"], "trl": best["trl"]}}
            rows += ratios({"max_len": longest}, max(best["lengths"]), f"{label} (fp32, one thread)")[0]
    return rows


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="builtin:smollm2", help="comma-separated builtin: names or model folders")
    parser.add_argument("--lengths", type=length_list, default="1024,2048,4096,8192,16384",
                        help=f"comma-separated token counts, each over the {PROMPT}-token prompt, rising")
    parser.add_argument("--micro-batch-tokens", type=int, default=16384,
                        help="tokens in the learner's one micro-batch at every length; at least the longest length")
    parser.add_argument("--new-tokens", type=int, default=8, help="tokens the sampler draws after each prompt")
    parser.add_argument("--growth-from", type=int, default=2048, help="the length learner_growth starts from")
    parser.add_argument("--budget-gb", type=float, default=8.0,
                        help="memory budget of max_trainable, in GB; every child is stopped past it")
    parser.add_argument("--trl-lengths", type=lambda t: length_list(t) if t else [], default="1024,2048,4096,8192,16384",
                        help="the ladder of max_trainable, rising; empty: leave max_trainable (and TRL) out")
    parser.add_argument("--save", help="folder to save the JSON in for bench/report.py")
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs=2, metavar=("KIND", "LENGTH"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        torch.set_num_threads(1)
        print(json.dumps(CHILDREN[options.child[0]](options, int(options.child[1]))))
        sys.exit(0)
    if options.micro_batch_tokens < max(options.lengths):
        parser.error(f"--micro-batch-tokens {options.micro_batch_tokens} is under the longest length "
                     f"{max(options.lengths)}: one sequence is the smallest micro-batch")
    limits = {model: checked_limit(parser, "--models", model) for model in options.models.split(",")}
    results = {model_label(model): one_model(options, model, limit) for model, limit in limits.items()}
    result = {"models": results, "lengths": options.lengths, "micro_batch_tokens": options.micro_batch_tokens,
              "new_tokens": options.new_tokens, "precision": "fp32", "threads": 1, "ratios": ratio_rows(results),
              "measured": measured("long_context", argv)}
    if options.save:
        save(result, options.save, "-".join(results))
    return result


if __name__ == "__main__":
    run_script(main, "long_context")
