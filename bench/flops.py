"""Training FLOP/s of the learner as a fraction of this CPU's peak; prints one JSON object.

Peak: measured here, not taken from a data sheet: the best of ``repeats`` runs of a
2048 x 2048 x 2048 matrix product on one thread (the learner's thread count), in fp32 and
in bf16 (2 x 2048^3 FLOP each), before the learner's steps and again after them. Achieved: ``6 x matmul parameters x tokens / seconds`` of
one ``Learner.step`` (best of ``repeats`` after a warm-up) on a batch of sequences shaped
like an RL step (tiny: 64 sequences of 24-48 tokens; SmolLM2: 16 of 96-160), with
tempering's defaults, in fp32 and with bf16 autocast. Matmul parameters are the weights of
the linear layers, output layer included (an embedding lookup costs no FLOPs); attention
scores and the extra forward passes of recomputation are not counted, as usual for model
FLOP utilisation.

``--profile`` adds, per model, where one fp32 learner step's time goes (torch's profiler, self
CPU time of each operator, after the timed steps): the share in matrix products (``mm``,
``addmm``, ``bmm``), in attention, in the optimizer's update and in everything else, the ten
costliest operators, and the FLOP/s of the matrix products alone (the step's matmul FLOPs over
their own time), which says whether the products or what lies between them bound the step.
``--precisions fp32`` skips bf16 (on a CPU without bf16 instructions it is emulated and slow).

    python bench/flops.py [--models tiny,smollm2] [--repeats 3] [--precisions fp32,bf16] [--profile]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from tempering.build import build_learner, resolve_algorithm
from tempering.config import load_config
from tempering.learner.step import collate
from tempering.policy import load_policy
from tempering.types import Problem, Rollout

from report import cpu_model

SHAPES = {"tiny": ("builtin:tiny", 64, (24, 48)), "smollm2": ("builtin:smollm2", 16, (96, 160))}
PROMPT = 12


def peak_flops(dtype: torch.dtype, repeats: int) -> float:
    a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * 2048**3 / best


def batch_for(vocab: int, sequences: int, lengths: tuple[int, int]):
    gen = torch.Generator().manual_seed(0)
    problem = Problem(task="bench", id="0", prompt="", answer="")
    rollouts = []
    for i in range(sequences):
        length = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=gen))
        ids = torch.randint(3, vocab, (length,), generator=gen).tolist()
        rollouts.append(Rollout(problem=problem, prompt_ids=ids[:PROMPT], completion_ids=ids[PROMPT:],
                                logprobs=[0.0] * (length - PROMPT), text="", finish_reason="stop", policy_version=0))
    batch = collate(rollouts, pad_id=0)
    batch.advantages_BT = torch.where(torch.arange(sequences)[:, None] % 2 == 0, 1.0, -1.0) * batch.loss_mask_BT
    return batch


CATEGORIES = {"matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"),
              "attention": ("scaled_dot_product", "flash_attention", "efficient_attention"),
              "optimizer": ("_foreach_", "adam", "lerp", "addcdiv")}
"""Operator-name fragments of each category of :func:`profile_step` (the first that matches)."""


def category(op: str) -> str:
    """``op``'s category in :data:`CATEGORIES`, or "other".

    >>> [category(o) for o in ("aten::addmm", "aten::_foreach_mul_", "aten::mul")]
    ['matmul', 'optimizer', 'other']
    """
    return next((name for name, parts in CATEGORIES.items() if any(part in op.lower() for part in parts)), "other")


def profile_step(learner, batch, matmul_flops: float) -> dict:
    """Where one learner step's time goes: self CPU time by category and by operator."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        learner.step(batch)
    ops = [(e.key, e.self_cpu_time_total / 1e6) for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(seconds for _, seconds in ops)
    shares = {name: 0.0 for name in [*CATEGORIES, "other"]}
    for op, seconds in ops:
        shares[category(op)] += seconds / total
    matmul_s = shares["matmul"] * total
    return {"self_s": total, "shares": shares, "matmul_flops_per_s": matmul_flops / matmul_s if matmul_s else 0.0,
            "top": [{"op": op, "s": round(seconds, 4), "share": round(seconds / total, 4)}
                    for op, seconds in sorted(ops, key=lambda o: -o[1])[:10]]}


def learner_flops(name: str, bf16: bool, repeats: int, profile: bool = False) -> dict:
    path, sequences, lengths = SHAPES[name]
    config = load_config(None, [f"model.path={path}", f"learner.bf16={str(bf16).lower()}"])
    model, _, _ = load_policy(path, "float32", config.pretrain, progress=False)
    learner = build_learner(model, config, resolve_algorithm(config))
    batch = batch_for(model.config.vocab_size, sequences, lengths)
    tokens = int(batch.attention_mask_BT.sum())
    matmul_params = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    learner.step(batch)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        learner.step(batch)
        best = min(best, time.perf_counter() - start)
    result = {"tokens": tokens, "matmul_params": matmul_params, "step_s": best,
              "flops_per_s": 6 * matmul_params * tokens / best}
    if profile:
        result["profile"] = profile_step(learner, batch, 6 * matmul_params * tokens)
    return result


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--precisions", default="fp32,bf16", help="fp32 and/or bf16 (autocast)")
    parser.add_argument("--profile", action="store_true", help="also where an fp32 step's time goes, by operator")
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    precisions = options.precisions.split(",")
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    peaks = {precision: peak_flops(dtypes[precision], options.repeats) for precision in precisions}
    result: dict = {"threads": 1, "cpu": cpu_model(), "peak_flops_per_s": peaks,
                    "peak_method": "best of repeats of a 2048^3 matmul, one thread, measured in this run"}
    runs = {name: {precision: learner_flops(name, precision == "bf16", options.repeats,
                                            options.profile and precision == "fp32")
                   for precision in precisions} for name in options.models.split(",")}
    for precision in precisions:  # measured again after: on a shared machine the best moment is the peak
        peaks[precision] = max(peaks[precision], peak_flops(dtypes[precision], options.repeats))
    for name, by_precision in runs.items():
        for precision, run in by_precision.items():
            run["fraction_of_peak"] = run["flops_per_s"] / peaks[precision]
        result[name] = by_precision
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=2))
