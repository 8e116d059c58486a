"""Sampling and training throughput with one inference server against two.

Three ``temper serve`` processes of ``--model`` on 127.0.0.1: two on one torch thread each, and
one on every core (what one server can make of this machine). Then two measurements:

- **Sampling**: rounds of ``--prompts`` problems of the model's task x ``--group`` samples of up
  to ``--max-new-tokens`` tokens, sent by a :class:`~tempering.rollout.remote.ServerGenerator`
  (the sampler of ``rollout.server``) to one server (``one``), to the server on every core
  (``one_all_cores``) and to both one-thread servers (``two``, the requests spread by load),
  the arms taking turns each round with the same seeds; completion tokens per second, the
  median over rounds.
- **Training** (``--train-steps`` > 0): ``temper train`` on the same model, synchronous, its
  rollouts sampled by one fresh one-thread server and then by two (``rollout.server.url`` a list;
  every step reloads each server with the new weights), the two arms alternating
  ``--train-repeats`` times; steps per second over the training loop (the steps' ``step_s``,
  start-up and evaluation left out) and the step's parts, the median over repeats.

Loopback HTTP on one machine: the servers share its cores with the learner and with each
other, so two servers can gain only where one leaves a core idle (one thread per server
here). Prints JSON::

    {"model", "cpu", "cores", "sampling": {"one"|"one_all_cores"|"two": {"tokens_per_s", "rollouts_per_s",
     "per_round"}}, "two_over_one", "two_over_one_all_cores",
     "train": {"one"|"two": {"steps_per_s", "generate_s_per_step", "weight_sync_s_per_step", "repeats"}},
     "train_two_over_one", "requests_per_server": the requests each of the two servers answered in
     the ``two`` arm, its first round (untimed) included}

    python bench/scale_servers.py [--model builtin:tiny] [--rounds 5] [--prompts 32] [--group 8]
        [--max-new-tokens 48] [--train-steps 10] [--train-repeats 2] [key=value ...]

``key=value`` overrides go to the training runs' config (and to the config the model is made with).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import torch

from tempering.build import build_tasks
from tempering.config import load_config
from tempering.policy import load_model
from tempering.rollout.base import SamplingParams
from tempering.rollout.remote import ServerGenerator, ServerSettings
from tempering.train import train

from report import cpu_model


@contextmanager
def served(model_path: str, threads: int) -> Iterator[str]:
    """``temper serve`` of ``model_path`` on ``threads`` torch threads, on a free port of
    127.0.0.1: its URL, stopped on leaving."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    process = subprocess.Popen([sys.executable, "-m", "tempering.cli", "serve", model_path, f"threads={threads}",
                                "--port", "0", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=env, text=True)
    try:
        line = process.stdout.readline()
        if " at http://" not in line:
            process.kill()
            raise SystemExit(f"bench: temper serve did not start: {process.stderr.read()[-2000:]}")
        yield line.split(" at ")[1].split()[0]
    finally:
        process.terminate()
        process.wait(timeout=30)


def sampling(config, model, tokenizer, resolved: str, args: argparse.Namespace) -> tuple[dict, dict]:
    """Each arm's completion tokens and rollouts per second over ``args.rounds`` rounds, and the
    requests each of the two servers took."""
    task = build_tasks(config)[0]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens)
    cores = os.cpu_count() or 1
    with ExitStack() as stack:
        first, second, wide = (stack.enter_context(served(resolved, t)) for t in (1, 1, cores))
        arms = {name: ServerGenerator(ServerSettings(urls), tokenizer, model.config)
                for name, urls in (("one", first), ("one_all_cores", wide), ("two", (first, second)))}
        problems = [task.train_problem(i) for i in range(args.prompts)]
        for generator in arms.values():  # a first round each, not counted: the servers' first batch
            generator.generate(problems[:2], 2, params, 0, torch.Generator().manual_seed(0))
        rates: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
        for round_ in range(args.rounds):
            problems = [task.train_problem(round_ * args.prompts + i) for i in range(args.prompts)]
            order = list(arms)[round_ % len(arms):] + list(arms)[:round_ % len(arms)]
            for name in order:
                started = time.perf_counter()
                groups = arms[name].generate(problems, args.group, params, 0, torch.Generator().manual_seed(round_ + 1))
                seconds = time.perf_counter() - started
                tokens = sum(len(r.completion_ids) for g in groups for r in g.rollouts)
                rates[name].append((tokens / seconds, args.prompts * args.group / seconds))
        requests = {url: int(count) for url, count in zip((first, second), (
            arms["two"].record()[f"server/{k}/requests"] for k in range(2)))}
        for generator in arms.values():
            generator.close()
    result = {name: {"tokens_per_s": statistics.median(t for t, _ in r), "rollouts_per_s": statistics.median(
        n for _, n in r), "per_round": [round(t, 1) for t, _ in r]} for name, r in rates.items()}
    return result, requests


def training(resolved: str, args: argparse.Namespace, root: Path) -> dict:
    """Synchronous ``temper train`` with its rollouts on one fresh server, then on two,
    alternating ``args.train_repeats`` times: each arm's median over repeats."""
    runs: dict[str, list[dict]] = {"one": [], "two": []}
    for repeat in range(args.train_repeats):
        for name in (("one", "two") if repeat % 2 == 0 else ("two", "one")):
            with ExitStack() as stack:
                urls = [stack.enter_context(served(resolved, 1)) for _ in range(1 if name == "one" else 2)]
                folder = root / f"{name}-{repeat}"
                config = load_config(None, [
                    f"model.path={args.model}", f"steps={args.train_steps}", f"run_dir={folder}", "seed=0",
                    "threads=1", f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
                    f"rollout.max_new_tokens={args.max_new_tokens}", "checkpoint.every=0",
                    "eval.problems_per_task=8", f"rollout.server.url=[{','.join(urls)}]", *args.overrides])
                train(config, progress=False)
            records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
            loop_s = sum(r["step_s"] for r in records)
            runs[name].append({"steps_per_s": len(records) / loop_s,
                               "generate_s_per_step": sum(r["generate_s"] for r in records) / len(records),
                               "weight_sync_s_per_step": sum(r.get("weight_sync_s", 0.0) for r in records) / len(records)})
    return {name: {key: statistics.median(r[key] for r in repeats) for key in repeats[0]} | {"repeats": len(repeats)}
            for name, repeats in runs.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:tiny", help="model path or builtin:NAME")
    parser.add_argument("--rounds", type=int, default=5, help="timed sampling rounds per arm (the median is kept)")
    parser.add_argument("--prompts", type=int, default=32, help="problems per round (and per training step)")
    parser.add_argument("--group", type=int, default=8, help="samples per problem")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--train-steps", type=int, default=10, help="steps of each training run; 0 = no training arm")
    parser.add_argument("--train-repeats", type=int, default=2, help="training runs per arm, alternating")
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    config = load_config(None, [f"model.path={args.model}", "threads=1", *args.overrides])
    model, tokenizer, resolved = load_model(config, args.model, progress=False)
    arms, requests = sampling(config, model, tokenizer, str(resolved), args)
    result = {"model": args.model, "cpu": cpu_model(), "cores": os.cpu_count(), "rounds": args.rounds,
              "prompts": args.prompts, "group": args.group, "max_new_tokens": args.max_new_tokens,
              "sampling": arms, "two_over_one": arms["two"]["tokens_per_s"] / arms["one"]["tokens_per_s"],
              "two_over_one_all_cores": arms["two"]["tokens_per_s"] / arms["one_all_cores"]["tokens_per_s"],
              "requests_per_server": list(requests.values())}
    if args.train_steps:
        with tempfile.TemporaryDirectory() as root:
            result["train"] = training(str(resolved), args, Path(root))
        result["train_two_over_one"] = result["train"]["two"]["steps_per_s"] / result["train"]["one"]["steps_per_s"]
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
