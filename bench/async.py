"""Synchronous vs asynchronous training on a workload whose reward takes real time.

The task is column addition written as a Python program (``add`` with ``style: program``):
every completion is run in the sandbox against the expected output, so scoring a step means
starting a jailed process per rollout. The built-in model is pre-trained for this format
first (cached like the default one; a few minutes the first time). Both modes then train
the same model on the same seed for the same steps, in this one process, one after the
other; the only difference is ``pipeline.mode`` (and torch threads: synchronous runs twice, on
all cores and on one thread, and the faster is the baseline, since on a loaded machine
all-core torch can be several times slower than one thread).

Timing covers the training loop only (the sum of the steps' wall time; start-up and the
before/after evaluations are left out). Prints JSON::

    {"sync": {"rollouts_per_s", "steps_per_s", "accuracy"},
     "async": {"rollouts_per_s", "steps_per_s", "accuracy", "dropped_stale", "dropped_stale_tokens",
               "token_staleness"},
     "speedup": async steps_per_s / sync steps_per_s,
     "cpu_bound": {"core_s_per_step", "cores", "best_step_s", "max_speedup"}, ...}

With ``--partial`` an asynchronous run with ``pipeline.partial_rollouts`` (new weights taking
over in the middle of a round) follows, as ``async_partial``, with ``partial_speedup`` (its
steps_per_s over the plain asynchronous run's). ``dropped_stale_tokens`` are the completion
tokens of the rollouts dropped as too stale (sampling thrown away); ``token_staleness`` the
mean over steps of ``staleness/token_mean``, each token by the version that drew it.

``cpu_bound`` is the ceiling this machine puts on any overlap: a step's work in CPU
core-seconds (sampling and learning as measured on one thread, plus grading, measured as
the busy time of all processes while the sandbox grades a step's worth of reference
programs) spread perfectly over every core, against the synchronous step time. When the
synchronous run already keeps the cores busy, no asynchronous schedule can beat it by more.

    python bench/async.py [--steps 40] [--quick] [--partial] [--max-staleness 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from tempering.config import load_config
from tempering.train import train


def overrides(steps: int, mode: str, run_dir: Path, problems: int, threads: int = 0,
              backend: str = "local", partial: bool = False, max_staleness: int = 1) -> list[str]:
    task = "{name: add, options: {style: program, digits: [2]}}"
    return [
        f"steps={steps}", f"run_dir={run_dir}", "seed=0", f"tasks=[{task}]", f"pretrain.tasks=[{task}]",
        "rollout.prompts_per_step=16", "rollout.group_size=8", "rollout.max_new_tokens=48",
        "eval.max_new_tokens=48", f"eval.problems_per_task={problems}", "checkpoint.every=0",
        f"pipeline.mode={mode}", "learner.warmup_steps=5", f"threads={threads}",
        f"pipeline.backend={backend}", f"pipeline.partial_rollouts={str(partial).lower()}",
        f"pipeline.max_staleness={max_staleness}",
    ]


def run(mode: str, steps: int, problems: int, root: Path, threads: int = 0, backend: str = "local",
        partial: bool = False, max_staleness: int = 1) -> dict:
    folder = root / f"{mode}-{threads}-{backend}{'-partial' if partial else ''}"
    config = load_config(None, overrides(steps, mode, folder, problems, threads, backend, partial, max_staleness))
    summary = train(config, progress=False)
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    loop_s = sum(r["step_s"] for r in records)
    taken = summary["rollouts"]["taken"]
    result = {
        "rollouts_per_s": taken / loop_s, "steps_per_s": steps / loop_s,
        "accuracy": summary["eval_after"]["accuracy"], "accuracy_before": summary["eval_before"]["accuracy"],
        "loop_s": loop_s, "generate_s_per_step": sum(r["generate_s"] for r in records) / steps,
        "reward_s_per_step": sum(r["reward_s"] for r in records) / steps,
        "learn_s_per_step": sum(r["learn_s"] for r in records) / steps,
    }
    if mode == "async":
        result["dropped_stale"] = summary["rollouts"]["dropped_stale"]
        result["dropped_stale_tokens"] = summary["rollouts"]["dropped_stale_tokens"]
        result["token_staleness"] = sum(r["staleness/token_mean"] for r in records) / steps
        result["wait_s_per_step"] = sum(r["wait_s"] for r in records) / steps
        result["max_staleness_seen"] = max(r["staleness"] for r in records)
    return result


def busy_core_seconds() -> float:
    """CPU seconds all processes of this machine have spent busy so far (Linux /proc/stat)."""
    with open("/proc/stat") as stat:
        ticks = list(map(int, stat.readline().split()[1:]))
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle and iowait


def reward_core_seconds(rounds: int = 3) -> float:
    """Busy CPU seconds (all processes: this one and the sandbox's) to grade one step's 16 x 8
    programs, measured on the task's reference programs; the median of ``rounds``."""
    from tempering.rewards.base import build_reward
    from tempering.tasks import build_task
    from tempering.types import Rollout

    task = build_task("add", seed=0, digits=[2], style="program")
    problems = [task.train_problem(i) for i in range(16) for _ in range(8)]
    rollouts = [Rollout(problem=p, prompt_ids=[], completion_ids=[], logprobs=[], finish_reason="stop",
                        policy_version=0, text=task.solution(p)) for p in problems]
    reward = build_reward("code", None)
    try:
        reward.score_batch(problems[:8], rollouts[:8])  # the sandbox's start-up is not a step's
        costs = []
        for _ in range(rounds):
            before = busy_core_seconds()
            reward.score_batch(problems, rollouts)
            costs.append(busy_core_seconds() - before)
    finally:
        reward.close()
    return sorted(costs)[len(costs) // 2]


def cpu_bound(one_thread: dict, sync: dict) -> dict:
    """The most any overlap of sampling, grading and learning can gain on this machine: a
    step's work in core-seconds (sampling and learning on one thread each, as the async
    run places them, plus grading) spread perfectly over every core, against the sync step."""
    cores = os.cpu_count() or 1
    work = one_thread["generate_s_per_step"] + one_thread["learn_s_per_step"] + reward_core_seconds()
    return {"core_s_per_step": work, "cores": cores, "best_step_s": work / cores,
            "max_speedup": (1 / sync["steps_per_s"]) / (work / cores)}


def partial_arm(plain: dict, steps: int, problems: int, root: Path, max_staleness: int) -> dict:
    """The asynchronous run again with partial rollouts, and its speed over ``plain``'s."""
    partial = run("async", steps, problems, root, partial=True, max_staleness=max_staleness)
    return {"async_partial": partial, "partial_speedup": partial["steps_per_s"] / plain["steps_per_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--problems", type=int, default=100, help="held-out problems for accuracy")
    parser.add_argument("--quick", action="store_true", help="a few steps, for a smoke test")
    parser.add_argument("--backend", default="local", choices=["local", "ray"],
                        help="where the asynchronous run's workers live (ray: separate processes)")
    parser.add_argument("--only", choices=["sync", "async"], help="run one mode only")
    parser.add_argument("--partial", action="store_true",
                        help="also an asynchronous run with pipeline.partial_rollouts (async_partial)")
    parser.add_argument("--max-staleness", type=int, default=1,
                        help="pipeline.max_staleness of the asynchronous runs (0: rollouts a version behind are dropped)")
    args = parser.parse_args()
    steps, problems = (3, 16) if args.quick else (args.steps, args.problems)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tempering-bench-async-") as tmp:
        # synchronous with all cores (the default) and with one thread: the better one is the baseline
        if args.only == "async":
            results = {"async": run("async", steps, problems, Path(tmp), backend=args.backend,
                                 max_staleness=args.max_staleness)}
            if args.partial:
                results.update(partial_arm(results["async"], steps, problems, Path(tmp), args.max_staleness))
            print(json.dumps(results if args.partial else results["async"], indent=2))
            return
        syncs = {threads: run("sync", steps, problems, Path(tmp), threads) for threads in (0, 1)}
        results = {"async": run("async", steps, problems, Path(tmp), backend=args.backend,
                                 max_staleness=args.max_staleness)}
        if args.partial:
            results.update(partial_arm(results["async"], steps, problems, Path(tmp), args.max_staleness))
    best = max(syncs, key=lambda t: syncs[t]["steps_per_s"])
    results["sync"] = {**syncs[best], "threads": best or "all cores"}
    results["sync_other_threads"] = {**syncs[1 - best if best in (0, 1) else 1], "threads": (1 - best) or "all cores"}
    results["speedup"] = results["async"]["steps_per_s"] / results["sync"]["steps_per_s"]
    one_thread = syncs[1]
    if os.path.exists("/proc/stat"):
        results["cpu_bound"] = cpu_bound(one_thread, results["sync"])
    results["settings"] = {"steps": steps, "task": "add (program style), 2 digits, graded in the sandbox",
                           "prompts_per_step": 16, "group_size": 8, "cores": os.cpu_count(),
                           "sync_threads": "the faster of all cores and one thread (the other is under sync_other_threads)",
                           "async_threads": "half the cores each for sampler and learner",
                           "max_staleness": args.max_staleness, "off_policy": "tis", "async_backend": args.backend}
    results["wall_s"] = time.perf_counter() - start
    json.dump(results, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
