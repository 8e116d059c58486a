"""Rollout engines side by side: the built-in sampler against vLLM (in-process and served); prints one JSON line.

    python bench/engines.py [--model builtin:tiny] [--batch-sizes 8,32,64] [--group-size 8]
        [--max-new-tokens 64] [--rl-steps 5] [--compile] [--threads N] [--repeats 2] [--skip-rl] [--trl]

Where vLLM is not installed it prints ``{"skipped": why}`` and exits 0.

Generation: each engine samples ``batch // group_size`` arithmetic prompts x ``group_size``
samples (``max_new_tokens``, temperature 1, rows ending at end-of-sequence or the limit), fp32;
tokens/s counts the tokens each made, best of ``--repeats`` after one warm-up call. Engines:
``builtin`` (tempering's sampler with ``rollout.onednn=false``: float32 decoding products by
MKL, the learner's), ``builtin_onednn`` (``rollout.onednn=true``: by oneDNN; the default,
``auto``, is this for models at least 512 wide such as SmolLM2 and ``builtin`` for narrower ones), ``vllm_eager`` (``vllm.LLM`` in this process,
``rollout.engine: vllm``) and, with ``--compile``, ``vllm_compiled`` (torch.compile; minutes to
start).

RL: ``--rl-steps`` steps of the quickstart (evaluation off) with each way of sampling:
``builtin``, ``vllm_engine`` (in-process, fp32), ``vllm_server`` (``rollout.server.launch: vllm``,
weights reloaded from disk each step, fp32) and ``vllm_engine_bf16`` (bf16 sampling beside the
fp32 learner: a real mismatch); for each, seconds per step (total, generation, weight sync;
the first step, which carries start-up costs, left out) and the mean ``mismatch/abs_logp`` and
``mismatch/k3``. ``key=value`` overrides apply to every run.

The peer, with ``--trl``: TRL's ``GRPOTrainer`` sampling with colocated vLLM
(``use_vllm=True, vllm_mode="colocate"``) for ``--rl-steps`` steps of the same task, batch
and length on the same model: its seconds per step, or, where it does not run, the exception
it stopped with and whether any step completed (needs the bench extra, TRL). Output::

    {"generation": {"batch_N": {"builtin_tok_s", "builtin_onednn_tok_s", "vllm_eager_tok_s", ...}}, "rl": {ENGINE: {...}},
     "trl_colocated": {...}, "settings": {...}}
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from tempering.config import PretrainConfig, builtin_config, load_config
from tempering.policy import load_policy
from tempering.rollout.base import SamplingParams
from tempering.rollout.hf import HFGenerator
from tempering.rollout.vllm_engine import VllmGenerator
from tempering.rollout.vllm_launch import VllmSettings, vllm_missing
from tempering.tasks import build_task
from tempering.train import train

RL_RUNS = {
    "builtin": [],
    "vllm_engine": ["rollout.engine=vllm"],
    "vllm_server": ["rollout.server={url: 'http://127.0.0.1:0', launch: vllm}"],
    "vllm_engine_bf16": ["rollout.engine=vllm", "rollout.vllm.dtype=bfloat16"],
}


def tokens_per_s(generator, problems, group_size: int, params: SamplingParams, repeats: int) -> float:
    """Best of ``repeats`` timed calls (after one warm-up) of completion tokens per second."""
    generator.generate(problems, group_size, params, generator=torch.Generator().manual_seed(0))
    best = 0.0
    for repeat in range(repeats):
        start = time.perf_counter()
        groups = generator.generate(problems, group_size, params, generator=torch.Generator().manual_seed(1 + repeat))
        made = sum(len(r.completion_ids) for g in groups for r in g.rollouts)
        best = max(best, made / (time.perf_counter() - start))
    return best


def generation(args, threads: int, pretrain: PretrainConfig) -> dict:
    """Tokens/s of each engine at each batch size."""
    model, tokenizer, _ = load_policy(args.model, "float32", pretrain, progress=False)
    task = build_task("add", seed=0, digits=[2])
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    engines = {"builtin": lambda: HFGenerator(model, tokenizer, onednn=False),
               "builtin_onednn": lambda: HFGenerator(model, tokenizer, onednn=True)}
    for name, compiled in [("vllm_eager", False)] + ([("vllm_compiled", True)] if args.compile else []):
        settings = VllmSettings("float32", kv_cache_gib=1.0, threads=threads, cpu_bind=None, compile=compiled,
                                seed=0, cpu=True)
        engines[name] = lambda settings=settings: VllmGenerator(model, tokenizer, settings)
    found: dict = {f"batch_{batch}": {} for batch in args.batch_sizes}
    for name, build in engines.items():  # one engine at a time: two vLLM engines would share this process
        engine = build()
        for batch in args.batch_sizes:
            problems = task.eval_problems(max(1, batch // args.group_size))
            speed = tokens_per_s(engine, problems, args.group_size, params, args.repeats)
            found[f"batch_{batch}"][f"{name}_tok_s"] = round(speed, 1)
        if hasattr(engine, "close"):
            engine.close()
    return found


def rl(args, threads: int, overrides: list[str]) -> dict:
    """Seconds per step and mismatch of the quickstart with each way of sampling."""
    found = {}
    for name, extra in RL_RUNS.items():
        with tempfile.TemporaryDirectory() as run_dir:
            config = load_config(builtin_config("quickstart"), [
                f"model.path={args.model}", "eval.every=0", "eval.problems_per_task=10", f"threads={threads}",
                f"rollout.max_new_tokens={args.max_new_tokens}", *overrides, *extra,
                f"steps={args.rl_steps}", f"run_dir={run_dir}"])
            train(config, progress=False)
            steps = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
        timed = steps[1:] or steps  # the first step carries start-up costs

        def mean(key: str, records=steps) -> float:
            return statistics.fmean(s[key] for s in records)

        found[name] = {"s_per_step": mean("step_s", timed), "generate_s_per_step": mean("generate_s", timed),
                       "weight_sync_s_per_step": mean("weight_sync_s", timed),
                       "generate_tok_s": sum(s["completion_tokens"] for s in timed) / sum(s["generate_s"] for s in timed),
                       "mismatch_abs_logp": mean("mismatch/abs_logp"), "mismatch_k3": mean("mismatch/k3")}
    return found


def trl_colocated(args, threads: int, pretrain: PretrainConfig) -> dict:
    """TRL's GRPO with colocated vLLM on the quickstart's task and batch (see the module docstring)."""
    import os
    import socket

    try:
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except Exception as err:  # TRL's import probes vLLM's, which can raise more than ImportError
        return {"error": f"TRL cannot be imported ({type(err).__name__}: {err}); pip install -e '.[bench]'"}
    config = load_config(builtin_config("quickstart"), [f"model.path={args.model}"])
    rc = config.rollout
    model, tokenizer, _ = load_policy(args.model, "float32", pretrain, progress=False)
    task = build_task("add", seed=0, digits=[2])
    dataset = Dataset.from_list([{"prompt": task.train_problem(i).prompt, "answer": task.train_problem(i).answer}
                                 for i in range(args.rl_steps * rc.prompts_per_step)])

    def exact(prompts, completions, answer, **_):
        return [float(str(a) in c) for c, a in zip(completions, answer)]

    ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, *_, **__):
            ends.append(time.perf_counter())

    with socket.socket() as probe:  # colocated vLLM joins a torch.distributed group of one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    with tempfile.TemporaryDirectory() as out:
        trl_args = GRPOConfig(
            output_dir=out, max_steps=args.rl_steps, seed=0, use_cpu=True, per_device_train_batch_size=rc.group_size,
            gradient_accumulation_steps=rc.prompts_per_step, num_generations=rc.group_size,
            max_completion_length=args.max_new_tokens, temperature=rc.temperature, learning_rate=config.learner.lr,
            beta=0.0, report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True,
            use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3)
        start = time.perf_counter()
        try:
            trainer = GRPOTrainer(model=model, reward_funcs=[exact], args=trl_args, train_dataset=dataset,
                                  processing_class=tokenizer, callbacks=[StepClock()])
            trainer.train()
        except Exception as err:
            import traceback

            inside = [f for f in traceback.extract_tb(err.__traceback__) if f"{os.sep}trl{os.sep}" in f.filename]
            return {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                    "raised_in_trl": [f"{f.name} ({Path(f.filename).name}:{f.lineno})" for f in inside[-2:]],
                    "steps_completed": len(ends), "threads": threads}
    durations = [b - a for a, b in zip([start] + ends, ends)][1:] or [ends[0] - start]
    return {"s_per_step": statistics.fmean(durations), "steps_completed": len(ends), "threads": threads}


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--batch-sizes", type=lambda text: [int(x) for x in text.split(",")], default=[8, 32, 64])
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rl-steps", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="also vLLM with torch.compile (minutes to start)")
    parser.add_argument("--threads", type=int, default=0, help="torch and vLLM threads; 0 = every core torch sees")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-rl", action="store_true")
    parser.add_argument("--trl", action="store_true", help="also TRL's GRPO with colocated vLLM (the bench extra)")
    args, overrides = parser.parse_known_args(argv)
    why = vllm_missing()
    if why is not None:
        return {"skipped": why}
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    pretrain = load_config(builtin_config("quickstart"), [f"model.path={args.model}", *overrides]).pretrain
    result = {"generation": generation(args, threads, pretrain)}
    if not args.skip_rl:
        result["rl"] = rl(args, threads, overrides)
    if args.trl:
        result["trl_colocated"] = trl_colocated(args, threads, pretrain)
    result["settings"] = {"model": args.model, "group_size": args.group_size, "max_new_tokens": args.max_new_tokens,
                          "threads": threads, "rl_steps": args.rl_steps, "torch": torch.__version__,
                          "vllm": __import__("vllm").__version__}
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
