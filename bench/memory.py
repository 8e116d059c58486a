"""Peak memory of one learner step against sequence length, tempering and TRL; prints one JSON object.

    python bench/memory.py [--model builtin:smollm2] [--budget-gb 8] [--lengths 512,1024,2048,4096,8192]
                           [--sides tempering,trl] [--bf16]

Each (side, length) runs in a fresh subprocess that loads the model, prepares one sequence of
that many tokens (a 64-token prompt, the rest a trained completion, advantage 1, on-policy
old log-probs), resets the kernel's peak-RSS mark (``/proc/self/clear_refs``), runs one
complete learner step (forward, backward, AdamW update) and reports its peak RSS
(``VmHWM``), which includes the process's resident model, gradients and optimizer state.
The parent watches each child and stops it once its RSS passes the budget; a side's
longest fitting length is the longest whose peak stayed within the budget. The same peaks
give the longest lengths within smaller budgets (3, 4 and 6 GB), also reported. Lengths above
the model's position limit are skipped. A child that ends any other way without a measurement
(TRL missing or failing to import, a crash) ends the bench with exit status 1 and the child's
error on stderr, and no JSON: a side that did not run has no longest length.

Children run with glibc's ``MALLOC_MMAP_THRESHOLD_`` at 1 MiB (both sides alike; ``--default-malloc``
leaves it alone), so that freed large buffers go back to the system at once. With the default
dynamic threshold, buffers of a few MB to 32 MB come from the heap and its fragmentation keeps
them resident: peaks then jump by a GB or more between lengths without any more live memory
(measured: tempering at 4096 tokens, 4.6 GB with the default, 2.7 GB with the fixed threshold).

- tempering: ``Learner.step`` as ``temper train`` builds it, with packing, log-probs 1024
  tokens at a time and gradient checkpointing on (``learner.gradient_checkpointing=true``).
- TRL: ``GRPOTrainer.training_step`` (its ``compute_loss`` and backward) on the same
  prepared batch, with generation bypassed (``_prepare_inputs`` returns the batch as is),
  then its AdamW step; TRL's defaults otherwise, including its gradient checkpointing and its
  fused, chunked LM head.

Both sides run in fp32 unless ``--bf16`` (autocast for both). Single-threaded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

PROMPT = 64
CHUNK = 1024
MMAP_THRESHOLD = 1024 * 1024
SMALLER_BUDGETS_GB = (3, 4, 6)


def _status(key: str, pid: str = "self") -> int:
    """A ``/proc/<pid>/status`` field in kB (0 once the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def _sequence(vocab: int, length: int) -> torch.Tensor:
    return torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(length))


def tempering_step(model_path: str, length: int, bf16: bool) -> dict:
    from tempering.algorithms.logprobs import forward_logprobs
    from tempering.config import load_config
    from tempering.models.loading import load_policy
    from tempering.build import build_learner, resolve_algorithm
    from tempering.types import Batch

    config = load_config(None, [f"model.path={model_path}", "learner.gradient_checkpointing=true",
                                "learner.packing=true", f"learner.logprob_chunk={CHUNK}",
                                f"learner.bf16={str(bf16).lower()}"])
    model, _, _ = load_policy(model_path, "float32", config.pretrain, progress=False)
    learner = build_learner(model, config, resolve_algorithm(config))
    ids_BT = _sequence(model.config.vocab_size, length)
    mask_BT = torch.zeros((1, length))
    mask_BT[:, PROMPT:] = 1
    with torch.no_grad():
        old_BT = forward_logprobs(model, ids_BT, torch.ones_like(ids_BT), keep_BT=mask_BT, chunk=CHUNK).logprobs_BT
    batch = Batch(input_ids_BT=ids_BT, attention_mask_BT=torch.ones_like(ids_BT), loss_mask_BT=mask_BT,
                  old_logprobs_BT=old_BT, advantages_BT=mask_BT.clone(), policy_versions_B=torch.zeros(1))
    before = _status("VmRSS")
    _reset_peak()
    learner.step(batch)
    return {"before_kb": before, "peak_kb": _status("VmHWM")}


def trl_step(model_path: str, length: int, bf16: bool) -> dict:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from tempering.config import PretrainConfig
    from tempering.models.loading import load_policy

    model, tokenizer, _ = load_policy(model_path, "float32", PretrainConfig(), progress=False)
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, use_cpu=True, bf16=bf16, per_device_train_batch_size=2, num_generations=2,
                          max_completion_length=length, report_to="none", save_strategy="no", disable_tqdm=True)
        trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
                              args=args, train_dataset=Dataset.from_list([{"prompt": "x"}] * 2),
                              processing_class=tokenizer)
    # what Trainer.train does before its first step
    if args.gradient_checkpointing:
        trainer.model.activation_checkpointing_enable(activation_checkpointing_kwargs=args.gradient_checkpointing_kwargs)
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1
    trainer._prepare_inputs = lambda inputs: inputs
    ids = _sequence(model.config.vocab_size, length)
    completion = length - PROMPT
    inputs = {"prompt_ids": ids[:, :PROMPT], "prompt_mask": torch.ones((1, PROMPT), dtype=torch.long),
              "completion_ids": ids[:, PROMPT:], "completion_mask": torch.ones((1, completion), dtype=torch.long),
              "advantages": torch.ones(1), "num_items_in_batch": torch.tensor(float(completion))}
    before = _status("VmRSS")
    _reset_peak()
    trainer.model.train()
    trainer.training_step(trainer.model, inputs, num_items_in_batch=inputs["num_items_in_batch"])
    trainer.optimizer.step()
    return {"before_kb": before, "peak_kb": _status("VmHWM")}


def child(side: str, model_path: str, length: int, bf16: bool) -> None:
    torch.set_num_threads(1)
    start = time.perf_counter()
    result = (tempering_step if side == "tempering" else trl_step)(model_path, length, bf16)
    print(json.dumps({**result, "wall_s": time.perf_counter() - start}))


class ChildFailed(RuntimeError):
    """A measuring child that ended without a measurement, other than by passing the budget."""


def measure(side: str, model_path: str, length: int, bf16: bool, budget_kb: int, default_malloc: bool) -> dict:
    """Run one child; stop it if its RSS passes the budget. A child that fails any other way
    raises ChildFailed with the end of its stderr: its side has no length to report."""
    command = [sys.executable, __file__, "--child", side, str(length), "--model", model_path] + (["--bf16"] if bf16
                                                                                                  else [])
    env = dict(os.environ) if default_malloc else {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
    with tempfile.TemporaryFile("w+") as errors:  # a file, not a pipe: a chatty child never blocks on it
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
        over = False
        while process.poll() is None:
            if _status("VmRSS", str(process.pid)) > budget_kb:
                over = True
                process.kill()
                break
            time.sleep(0.1)
        output = process.communicate()[0]
        if over:
            return {"peak_mb": None, "over_budget": True}
        if process.returncode != 0:
            errors.seek(0)
            raise ChildFailed(f"the {side} side failed at {length} tokens (exit status {process.returncode}):\n"
                              + errors.read()[-3000:])
    result = json.loads(output.strip().splitlines()[-1])
    return {"peak_mb": result["peak_kb"] / 1024, "before_step_mb": result["before_kb"] / 1024,
            "wall_s": result["wall_s"]}


def length_list(text: str) -> list[int]:
    """``"512,1024"`` -> ``[512, 1024]``; a length not over the prompt is an error (it trains nothing)."""
    lengths = [int(n) for n in text.split(",")]
    if min(lengths) <= PROMPT:
        raise argparse.ArgumentTypeError(f"each length must be over the {PROMPT}-token prompt, so that it trains "
                                         f"a completion: {text}")
    return lengths


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2")
    parser.add_argument("--budget-gb", type=float, default=8.0)
    parser.add_argument("--lengths", type=length_list, default="512,1024,2048,4096,8192",
                        help=f"comma-separated token counts, each over the {PROMPT}-token prompt")
    parser.add_argument("--sides", default="tempering,trl")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--default-malloc", action="store_true", help="leave glibc's mmap threshold dynamic")
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "LENGTH"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        child(options.child[0], options.model, int(options.child[1]), options.bf16)
        sys.exit(0)

    from transformers import AutoConfig

    from tempering.config import PretrainConfig
    from tempering.models.loading import resolve_model_path

    path = resolve_model_path(options.model, PretrainConfig(), progress=False)
    config = (AutoConfig.from_pretrained(str(Path(path).parent), gguf_file=Path(path).name) if path.endswith(".gguf")
              else AutoConfig.from_pretrained(path))
    limit = config.max_position_embeddings
    lengths = [n for n in options.lengths if n <= limit]
    budget_kb = int(options.budget_gb * 1024 * 1024)
    peaks: dict = {}
    details: dict = {}
    longest: dict = {}
    for side in options.sides.split(","):
        peaks[side], details[side], longest[side] = {}, {}, 0
        for length in lengths:
            result = measure(side, options.model, length, options.bf16, budget_kb, options.default_malloc)
            peaks[side][length], details[side][length] = result["peak_mb"], result
            if result["peak_mb"] is None or result["peak_mb"] > options.budget_gb * 1024:
                break  # memory grows with length: longer ones do not fit either
            longest[side] = length
    by_budget = {gb: {side: max([n for n, mb in peaks[side].items() if mb is not None and mb <= gb * 1024],
                                default=0) for side in peaks}
                 for gb in SMALLER_BUDGETS_GB if gb < options.budget_gb}
    return {"budget_gb": options.budget_gb, "max_len_tempering": longest.get("tempering"),
            "max_len_trl": longest.get("trl"), "peak_mb": peaks, "max_len_at_smaller_budgets_gb": by_budget,
            "model": options.model, "position_limit": limit,
            "precision": "bf16 autocast" if options.bf16 else "fp32",
            "malloc_mmap_threshold": None if options.default_malloc else MMAP_THRESHOLD, "details": details}


if __name__ == "__main__":
    try:
        print(json.dumps(main(sys.argv[1:]), indent=2))
    except ChildFailed as failure:
        sys.exit(f"bench/memory.py: {failure}\nno result: a side that cannot run has no longest length")
