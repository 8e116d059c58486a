"""A learner step with each group's prompt computed once, against once per row, under gradient checkpointing at long prompts; prints one JSON object.

    python bench/shared_prompts.py [--model builtin:smollm2] [--prompt-tokens 1024,2048]
                                   [--groups 2] [--group-size 4] [--completion-tokens 32]
                                   [--budget-gb 6] [--repeats 2]

The shape of a long-context RL step (``configs/smollm2-long.yaml``'s): ``--groups`` prompts of
``--prompt-tokens`` tokens, each sampled ``--group-size`` times with completions of
``--completion-tokens`` tokens, rewards that differ within every group (so no row is skipped),
one ``Learner.step`` (forward, backward, AdamW; fp32, one thread, gradient checkpointing, log-probs
1024 tokens at a time, micro-batches planned by ``learner.memory_budget_gb``). Two arms, each
step in a fresh process (``bench/memory.py``'s children) so their peaks are their own, taken in
turn (shared first on even repeats): ``learner.share_prompts`` on (a group's prompt computed
once, the decoder run a layer at a time under one checkpoint per layer) and off (every row
computes its prompt). Reported per length and arm: the median step seconds over
``--repeats``, peak RSS, the learner's micro-batches and their layouts (``shared``, or
``packed``/``padded``); and ``unshared_over_shared``, the time
ratio. Both arms train the same rows; their updates agree to float summation order
(``tests/unit/test_shared_prompts.py``).

Not measured: bf16, several threads, a whole run (``temper train smollm2-long``'s learner
seconds per step are in its metrics as ``time/learn_s``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from memory import (CHUNK, length_list, load_for_length, peak_kb, reset_peak, run_child, run_script)
from report import measured

ARMS = ("shared", "unshared")


def child(model_path: str, arm: str, prompt: int, groups: int, group_size: int, completion: int,
          budget_gb: float) -> dict:
    """One measured ``Learner.step`` of ``arm`` (after one unmeasured step of the same batch)."""
    from tempering.build import build_learner, resolve_algorithm
    from tempering.config import load_config
    from tempering.types import Batch

    torch.set_num_threads(1)
    config = load_config(None, [f"model.path={model_path}", "learner.gradient_checkpointing=true",
                                f"learner.logprob_chunk={CHUNK}", f"learner.memory_budget_gb={budget_gb}",
                                f"learner.share_prompts={str(arm == 'shared').lower()}"])
    model, _ = load_for_length(model_path, prompt + completion)
    learner = build_learner(model, config, resolve_algorithm(config))
    gen = torch.Generator().manual_seed(prompt)
    prompts = torch.randint(3, model.config.vocab_size, (groups, prompt), generator=gen)
    rows = groups * group_size
    ids_BT = torch.cat([prompts.repeat_interleave(group_size, dim=0),
                        torch.randint(3, model.config.vocab_size, (rows, completion), generator=gen)], dim=1)
    mask_BT = torch.zeros(ids_BT.shape)
    mask_BT[:, prompt:] = 1
    spread_B = torch.linspace(-1.0, 1.0, group_size).repeat(groups)  # every group has signal
    batch = Batch(input_ids_BT=ids_BT, attention_mask_BT=torch.ones_like(ids_BT), loss_mask_BT=mask_BT,
                  old_logprobs_BT=torch.zeros(ids_BT.shape), advantages_BT=mask_BT * spread_B[:, None],
                  policy_versions_B=torch.zeros(rows), prompt_lengths_B=torch.full((rows,), prompt))
    layouts = sorted({part.layout.value for part in learner.plan(batch).micro_batches})
    learner.step(batch)  # warm-up: allocator, kernels, optimizer state
    before = reset_peak()
    start = time.perf_counter()
    metrics = learner.step(batch)
    return {"step_s": time.perf_counter() - start, "before_kb": before, "peak_kb": peak_kb(),
            "micro_batches": metrics.get("micro_batches"), "layouts": layouts, "rows": rows,
            "tokens": int(ids_BT.numel())}


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2")
    parser.add_argument("--prompt-tokens", type=length_list, default="1024,2048", help="comma-separated prompt lengths")
    parser.add_argument("--groups", type=int, default=2, help="distinct prompts in the step")
    parser.add_argument("--group-size", type=int, default=4, help="completions sampled per prompt")
    parser.add_argument("--completion-tokens", type=int, default=32)
    parser.add_argument("--budget-gb", type=float, default=6.0, help="learner.memory_budget_gb of both arms")
    parser.add_argument("--repeats", type=int, default=2, help="steps measured per arm and length, in turn")
    parser.add_argument("--child", nargs=2, metavar=("ARM", "PROMPT"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if min(options.groups, options.group_size, options.completion_tokens, options.repeats) < 1:
        parser.error("--groups, --group-size, --completion-tokens and --repeats must be at least 1")
    if options.child:
        arm, prompt = options.child[0], int(options.child[1])
        return child(options.model, arm, prompt, options.groups, options.group_size, options.completion_tokens,
                     options.budget_gb)

    shape = ["--model", options.model, "--groups", str(options.groups), "--group-size", str(options.group_size),
             "--completion-tokens", str(options.completion_tokens), "--budget-gb", str(options.budget_gb)]
    lengths: dict[str, dict] = {}
    for prompt in options.prompt_tokens:
        runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
        for repeat in range(options.repeats):
            for arm in ARMS if repeat % 2 == 0 else ARMS[::-1]:
                command = [sys.executable, __file__, *shape, "--child", arm, str(prompt)]
                runs[arm].append(run_child(command, f"the {arm} step at {prompt} tokens", budget_kb=64 * 1024 ** 2))
        summary = {arm: {"step_s": statistics.median(r["step_s"] for r in made),
                         "peak_mb": max(r["peak_mb"] for r in made), "micro_batches": made[0]["micro_batches"],
                         "layouts": made[0]["layouts"],
                         "steps_s": [round(r["step_s"], 3) for r in made]} for arm, made in runs.items()}
        summary["unshared_over_shared"] = summary["unshared"]["step_s"] / summary["shared"]["step_s"]
        lengths[str(prompt)] = summary
    result = {"model": options.model, "threads": 1, "groups": options.groups, "group_size": options.group_size,
              "completion_tokens": options.completion_tokens, "budget_gb": options.budget_gb, "prompts": lengths,
              "measured": measured("shared_prompts", argv)}
    return result


if __name__ == "__main__":
    if "--child" in sys.argv:
        print(json.dumps(main(sys.argv[1:])))
    else:
        run_script(main, "shared_prompts")
