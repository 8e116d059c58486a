"""Slow reasoning-gym types: generation cost, and what generating ahead saves; prints one JSON object.

    python bench/rg_prefetch.py [--types knight_swap,zebra_puzzles] [--steps 6] [--per-step 4]

Three measurements, all in this process:

- ``seconds_per_item``: each type's first ``--items`` training items generated on demand
  (``prefetch: 0``), building their block of seeds included;
- ``gil``: one unit of sampling work (the built-in tiny model sampling 16 prompts x 8) alone,
  then while items are generated in a thread of this process, then in a worker process: a
  thread holds the interpreter lock against the sampling loop, which is why ``prefetch`` uses
  a process;
- ``stream``: a loop that takes ``--per-step`` items of a type and then does one unit of
  sampling work, ``--steps`` times, with ``prefetch: 0`` and with the default prefetch: the
  wall time of each and the time spent waiting for items.

Needs the reasoning-gym package. The tiny model is cached after its first pre-training.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import threading
import time

import torch

from tempering.config import PretrainConfig
from tempering.policy import load_policy
from tempering.rollout.hf import HFGenerator, SamplingParams
from tempering.tasks import build_task
from tempering.tasks.reasoning_gym import PREFETCH_AHEAD, _Source


def sampling_work():
    """One unit of sampling work: the tiny model samples 8 completions for 16 prompts."""
    model, tokenizer, _ = load_policy("builtin:tiny", "float32", PretrainConfig(), progress=False)
    generator = HFGenerator(model, tokenizer, None, 256)
    task = build_task("mul", seed=0)
    problems = [task.train_problem(i) for i in range(16)]
    params = SamplingParams(temperature=1.0, max_new_tokens=48)

    def work() -> float:
        start = time.perf_counter()
        generator.generate(problems, 8, params, 0, torch.Generator().manual_seed(0))
        return time.perf_counter() - start

    work()  # warm up
    return work


def _generate_until(rg_type: str, stop, count) -> None:
    source = _Source(rg_type, {}, False)
    i = 0
    while not stop.is_set():
        source.item(i * 100, 0)
        i += 1
        with count.get_lock():
            count.value += 1


def gil(work, rg_type: str, reps: int) -> dict:
    """Sampling work alone, beside a generating thread, beside a generating process."""
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    result = {"work_alone_s": sum(work() for _ in range(reps)) / reps}
    for kind in ("thread", "process"):
        stop, count = ctx.Event(), ctx.Value("i", 0)
        cls = threading.Thread if kind == "thread" else ctx.Process
        worker = cls(target=_generate_until, args=(rg_type, stop, count), daemon=True)
        worker.start()
        while count.value == 0:  # generating, not importing
            time.sleep(0.05)
        before = count.value
        result[f"work_with_{kind}_s"] = sum(work() for _ in range(reps)) / reps
        result[f"items_made_by_{kind}"] = count.value - before
        stop.set()
        worker.join()
    return result


def stream(work, rg_type: str, prefetch: int, steps: int, per_step: int) -> dict:
    task = build_task(f"rg:{rg_type}", seed=0, eval_size=4, prefetch=prefetch)
    try:
        start = time.perf_counter()
        task.eval_problems(4)
        waiting = time.perf_counter() - start
        for step in range(steps):
            t0 = time.perf_counter()
            for i in range(step * per_step, (step + 1) * per_step):
                task.train_problem(i)
            waiting += time.perf_counter() - t0
            work()
        return {"wall_s": time.perf_counter() - start, "waiting_for_items_s": waiting}
    finally:
        task.close()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", default="knight_swap,zebra_puzzles,intermediate_integration")
    parser.add_argument("--steps", type=int, default=6, help="sampling steps in the stream loop")
    parser.add_argument("--per-step", type=int, default=4, help="items of the type each step takes")
    parser.add_argument("--items", type=int, default=5, help="items timed per type for seconds_per_item")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    types = args.types.split(",")
    per_item = {}
    for rg_type in types:
        task = build_task(f"rg:{rg_type}", seed=0, eval_size=1, prefetch=0)
        task.eval_problems(1)
        start = time.perf_counter()
        for i in range(args.items):
            task.train_problem(i)
        per_item[rg_type] = (time.perf_counter() - start) / args.items
    work = sampling_work()
    result = {"seconds_per_item": per_item, "gil": gil(work, types[0], reps=3), "stream": {},
              "steps": args.steps, "per_step": args.per_step, "prefetch": PREFETCH_AHEAD}
    for rg_type in types:
        result["stream"][rg_type] = {"prefetch_off": stream(work, rg_type, 0, args.steps, args.per_step),
                                     "prefetch_on": stream(work, rg_type, PREFETCH_AHEAD, args.steps, args.per_step)}
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
