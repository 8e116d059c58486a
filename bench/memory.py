"""Peak memory of one learner step against sequence length, tempering and TRL; prints one JSON object.

    python bench/memory.py [--model builtin:smollm2] [--budgets-gb 2,4,8] [--lengths 512,1024,2048,4096,8192]
                           [--sides tempering,trl] [--bf16] [--save DIR]

Each (side, length) runs in a fresh subprocess that loads the model, prepares one sequence of
that many tokens (a 64-token prompt, the rest a trained completion, advantage 1, on-policy
old log-probs), resets the kernel's peak-RSS mark (``/proc/self/clear_refs``), runs one
complete learner step (forward, backward, AdamW update) and reports its peak RSS
(``VmHWM``), which includes the process's resident model, gradients and optimizer state.
The parent watches each child and stops it once its RSS passes the largest budget. Lengths
go up in the order given and a side stops at its first length over the largest budget (memory
grows with length: longer ones do not fit either), so a side that runs out early costs one
short child, not the whole ladder. At each budget a side's longest length is the longest whose
peak stayed within it. Lengths above the model's position limit are skipped, so the ladder's
top is the limit (8192 for SmolLM2 as converted from its GGUF). A child that ends any other
way without a measurement (TRL missing or failing to import, a crash) ends the bench with exit
status 1 and the child's error on stderr, and no JSON: a side that did not run has no longest length.

``ratios`` (for ``bench/report.py``; ``--save DIR`` writes ``DIR/memory-<model>.json``): at each
budget, tempering's longest length over TRL's, with ``at_least`` when tempering's longest is the
ladder's top (it might train longer still). A budget where a side trains no length has no ratio
and a line in ``notes`` instead: in fp32 a model's weights, gradients and AdamW moments take 16
bytes a parameter before any activation (2.2 GB for SmolLM2-135M, more than 2 GB).

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

Both sides run in fp32 unless ``--bf16`` (autocast for both). Single-threaded. The child
functions and :func:`run_child` are shared with ``bench/long_context.py``, which also trains
past the position limit (:func:`load_for_length`).
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
from typing import Callable

import torch
from report import measured, save

import tempering  # noqa: F401  # before transformers: hides CUDA-only torchvision builds beside a CPU torch

PROMPT = 64
CHUNK = 1024
MMAP_THRESHOLD = 1024 * 1024


def _status(key: str, pid: str = "self") -> int:
    """A ``/proc/<pid>/status`` field in kB (0 once the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def reset_peak() -> int:
    """Reset this process's peak-RSS mark; the RSS now, in kB."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status("VmRSS")


def peak_kb() -> int:
    """This process's peak RSS since :func:`reset_peak`, in kB."""
    return _status("VmHWM")


def sequences(vocab: int, rows: int, length: int) -> torch.Tensor:
    """``rows`` random sequences of ``length`` token ids (ids 0-2 left out: special tokens)."""
    return torch.randint(3, vocab, (rows, length), generator=torch.Generator().manual_seed(length))


def load_for_length(model_path: str, length: int):
    """``(model, tokenizer)`` in fp32, its position limit raised to ``length`` where that is
    more: RoPE computes every position's angles, so a longer sequence runs with the same
    weights (for memory and time; quality past the trained positions is not measured)."""
    from tempering.config import PretrainConfig
    from tempering.policy import load_policy

    model, tokenizer, _ = load_policy(model_path, "float32", PretrainConfig(), progress=False)
    model.config.max_position_embeddings = max(model.config.max_position_embeddings, length)
    return model, tokenizer


def tempering_step(model_path: str, length: int, bf16: bool, rows: int = 1,
                   then: Callable[[torch.nn.Module], dict] | None = None) -> dict:
    """Peak RSS and seconds of one ``Learner.step`` on ``rows`` sequences of ``length`` tokens,
    all in one micro-batch (``learner.token_budget`` = rows x length), with what ``then``
    finds out from the model after the measured step."""
    from tempering.build import build_learner, resolve_algorithm
    from tempering.config import load_config
    from tempering.learner.forward import forward_logprobs
    from tempering.types import Batch

    config = load_config(None, [f"model.path={model_path}", "learner.gradient_checkpointing=true",
                                "learner.packing=true", f"learner.logprob_chunk={CHUNK}",
                                f"learner.token_budget={rows * length}", f"learner.bf16={str(bf16).lower()}"])
    model, _ = load_for_length(model_path, length)
    learner = build_learner(model, config, resolve_algorithm(config))
    ids_BT = sequences(model.config.vocab_size, rows, length)
    mask_BT = torch.zeros((rows, length))
    mask_BT[:, PROMPT:] = 1
    with torch.no_grad():
        old_BT = forward_logprobs(model, ids_BT, torch.ones_like(ids_BT), keep_BT=mask_BT, chunk=CHUNK).logprobs_BT
    batch = Batch(input_ids_BT=ids_BT, attention_mask_BT=torch.ones_like(ids_BT), loss_mask_BT=mask_BT,
                  old_logprobs_BT=old_BT, advantages_BT=mask_BT.clone(), policy_versions_B=torch.zeros(rows))
    before = reset_peak()
    start = time.perf_counter()
    learner.step(batch)
    result = {"before_kb": before, "peak_kb": peak_kb(), "step_s": time.perf_counter() - start,
              "tokens": rows * length, "attention": model.config._attn_implementation}
    return {**result, **(then(model) if then else {})}


def trl_step(model_path: str, length: int, bf16: bool) -> dict:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = load_for_length(model_path, length)
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, use_cpu=True, bf16=bf16, per_device_train_batch_size=2, num_generations=2,
                          max_completion_length=length, report_to="none", save_strategy="no", disable_tqdm=True)
        trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
                              args=args, train_dataset=Dataset.from_list([{"prompt": "x"}] * 2),
                              processing_class=tokenizer)
    # what Trainer.train does before its first step (transformers 5.x)
    if args.gradient_checkpointing:
        kwargs = dict(args.gradient_checkpointing_kwargs or {})
        every, offload = kwargs.pop("every_n_layers", 1), kwargs.pop("offload", False)
        trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None,
                                                    every_n_layers=every, offload=offload)
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1
    trainer._prepare_inputs = lambda inputs: inputs
    ids = sequences(model.config.vocab_size, 1, length)
    completion = length - PROMPT
    inputs = {"prompt_ids": ids[:, :PROMPT], "prompt_mask": torch.ones((1, PROMPT), dtype=torch.long),
              "completion_ids": ids[:, PROMPT:], "completion_mask": torch.ones((1, completion), dtype=torch.long),
              "advantages": torch.ones(1), "num_items_in_batch": torch.tensor(float(completion))}
    before = reset_peak()
    start = time.perf_counter()
    trainer.model.train()
    trainer.training_step(trainer.model, inputs, num_items_in_batch=inputs["num_items_in_batch"])
    trainer.optimizer.step()
    return {"before_kb": before, "peak_kb": peak_kb(), "step_s": time.perf_counter() - start, "tokens": length,
            "attention": model.config._attn_implementation}


def child(side: str, model_path: str, length: int, bf16: bool) -> None:
    torch.set_num_threads(1)
    start = time.perf_counter()
    result = (tempering_step if side == "tempering" else trl_step)(model_path, length, bf16)
    print(json.dumps({**result, "wall_s": time.perf_counter() - start}))


class ChildFailed(RuntimeError):
    """A measuring child that ended without a measurement, other than by passing the budget."""


def run_child(command: list[str], what: str, budget_kb: int, default_malloc: bool = False) -> dict | None:
    """Run ``command`` (a child printing one JSON line last) and return that JSON, with
    ``peak_mb`` and ``before_mb`` from its ``peak_kb`` and ``before_kb`` where it has them; None when its RSS
    passed ``budget_kb`` and it was stopped. A child that fails any other way raises ChildFailed
    naming ``what`` with the end of its stderr."""
    env = dict(os.environ) if default_malloc else {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
    with tempfile.TemporaryFile("w+") as errors:  # a file, not a pipe: a chatty child never blocks on it
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
        while process.poll() is None:
            if _status("VmRSS", str(process.pid)) > budget_kb:
                process.kill()
                process.communicate()
                return None
            time.sleep(0.1)
        output = process.communicate()[0]
        if process.returncode != 0:
            errors.seek(0)
            raise ChildFailed(f"{what} failed (exit status {process.returncode}):\n" + errors.read()[-3000:])
    result = json.loads(output.strip().splitlines()[-1])
    if "peak_kb" in result:
        result.update(peak_mb=result["peak_kb"] / 1024, before_mb=result["before_kb"] / 1024)
    return result


def measure(side: str, model_path: str, length: int, bf16: bool, budget_kb: int, default_malloc: bool,
            script: str = __file__) -> dict:
    """One side's learner step at ``length`` in a fresh child of ``script``: ``peak_mb`` None
    and ``over_budget`` when it passed the budget."""
    command = [sys.executable, script, "--child", side, str(length), "--model", model_path] + (["--bf16"] if bf16
                                                                                                else [])
    result = run_child(command, f"the {side} side at {length} tokens", budget_kb, default_malloc)
    return {"peak_mb": None, "over_budget": True} if result is None else result


def ladder(sides: list[str], model_path: str, lengths: list[int], bf16: bool, budgets_gb: list[float],
           default_malloc: bool = False, script: str = __file__) -> dict:
    """Each side's peak at each length, going up until a length passes the largest budget,
    and its longest length within each budget: ``{"peak_mb", "details", "max_len"}``
    (``max_len[str(gb)][side]``, 0 where no length fit)."""
    cap_mb = max(budgets_gb) * 1024
    peaks: dict = {}
    details: dict = {}
    for side in sides:
        peaks[side], details[side] = {}, {}
        for length in lengths:
            result = measure(side, model_path, length, bf16, int(cap_mb * 1024), default_malloc, script)
            peaks[side][length], details[side][length] = result["peak_mb"], result
            print(f"memory: {side} {length} tokens: {result['peak_mb'] or 'over'} MB", file=sys.stderr, flush=True)
            if result["peak_mb"] is None or result["peak_mb"] > cap_mb:
                break  # memory grows with length: longer ones do not fit either
    max_len = {f"{gb:g}": {side: max([n for n, mb in peaks[side].items() if mb is not None and mb <= gb * 1024],
                                    default=0) for side in sides}
               for gb in budgets_gb}
    return {"peak_mb": peaks, "details": details, "max_len": max_len}


def ratios(found: dict, top: int, label: str) -> tuple[list[dict], list[str]]:
    """Tempering's longest length over TRL's at each budget of ``found["max_len"]`` (a lower
    bound where tempering's is ``top``, the ladder's last length), and a note for each budget
    where a side that ran trained no length (no ratio there)."""
    entries, notes = [], []
    for gb, longest in found["max_len"].items():
        short = [side for side, n in longest.items() if n == 0]
        if short:
            notes.append(f"{gb} GB: {' and '.join(short)} trained no length of the ladder ({longest}): the process's "
                         f"runtime and, in fp32, the weights, gradients and AdamW moments at 16 bytes a parameter "
                         f"come before any activation")
        elif {"tempering", "trl"} <= set(longest):
            ours, theirs = longest["tempering"], longest["trl"]
            entries.append({"what": f"longest sequence one learner step trains within {gb} GB, {label}: tempering "
                                    f"{ours} tokens, TRL {theirs} (tempering / TRL)",
                            "ratio": ours / theirs, **({"at_least": True} if ours == top else {})})
    return entries, notes


def number_list(text: str, kind=float) -> list:
    """``"2,4,8"`` -> ``[2.0, 4.0, 8.0]`` (argparse reports a ValueError as a bad value)."""
    return [kind(n) for n in text.split(",")]


def length_list(text: str) -> list[int]:
    """``"512,1024"`` -> ``[512, 1024]``; a length not over the prompt is an error (it trains nothing)."""
    lengths = number_list(text, int)
    if min(lengths) <= PROMPT:
        raise argparse.ArgumentTypeError(f"each length must be over the {PROMPT}-token prompt, so that it trains "
                                         f"a completion: {text}")
    return lengths


def position_limit(model: str) -> int:
    """The model's ``max_position_embeddings``, read from its config without loading weights."""
    from transformers import AutoConfig

    from tempering.config import PretrainConfig
    from tempering.policy import resolve_model_path

    path = resolve_model_path(model, PretrainConfig(), progress=False)
    config = (AutoConfig.from_pretrained(str(Path(path).parent), gguf_file=Path(path).name) if path.endswith(".gguf")
              else AutoConfig.from_pretrained(path))
    return config.max_position_embeddings


def checked_limit(parser: argparse.ArgumentParser, flag: str, model: str) -> int:
    """:func:`position_limit`, or a usage error naming ``flag`` when the model cannot be found."""
    from tempering.models.loading import ModelLoadError

    try:
        return position_limit(model)
    except (ModelLoadError, OSError, ValueError) as err:
        parser.error(f"{flag} {model}: {err}")


def model_label(model: str) -> str:
    """A short name for file names and table rows: ``builtin:smollm2`` -> ``smollm2``, a folder -> its name."""
    return model.removeprefix("builtin:") if model.startswith("builtin:") else Path(model).name


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2")
    parser.add_argument("--budgets-gb", type=number_list, default="2,4,8",
                        help="comma-separated memory budgets in GB; a child is stopped past the largest")
    parser.add_argument("--lengths", type=length_list, default="512,1024,2048,4096,8192",
                        help=f"comma-separated token counts, each over the {PROMPT}-token prompt")
    parser.add_argument("--sides", default="tempering,trl")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--default-malloc", action="store_true", help="leave glibc's mmap threshold dynamic")
    parser.add_argument("--save", help="folder to save the JSON in for bench/report.py")
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "LENGTH"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        child(options.child[0], options.model, int(options.child[1]), options.bf16)
        sys.exit(0)
    limit = checked_limit(parser, "--model", options.model)
    lengths = [n for n in options.lengths if n <= limit]
    precision = "bf16 autocast" if options.bf16 else "fp32"
    found = ladder(options.sides.split(","), options.model, lengths, options.bf16, options.budgets_gb,
                   options.default_malloc)
    entries, notes = ratios(found, max(lengths), f"{model_label(options.model)} ({precision}, one thread)")
    result = {"budgets_gb": options.budgets_gb, "max_len": found["max_len"], "peak_mb": found["peak_mb"],
              "ratios": entries, "notes": notes, "model": options.model, "position_limit": limit,
              "lengths": lengths, "precision": precision,
              "malloc_mmap_threshold": None if options.default_malloc else MMAP_THRESHOLD,
              "details": found["details"], "measured": measured("memory", argv)}
    if options.save:
        save(result, options.save, model_label(options.model) + ("-bf16" if options.bf16 else ""))
    return result


def run_script(bench_main: Callable[[list[str]], dict], name: str) -> None:
    """Print ``bench_main``'s JSON; a child that failed ends the script with its error instead."""
    try:
        print(json.dumps(bench_main(sys.argv[1:]), indent=2))
    except ChildFailed as failure:
        sys.exit(f"bench/{name}.py: {failure}\nno result: a side that cannot run has no longest length")


if __name__ == "__main__":
    run_script(main, "memory")
