"""What one program costs the ``code`` reward on a step shaped like the config's; prints JSON.

    python bench/code_reward.py [--config code] [--rounds 5] [--seed 0] [--ready 16] [--idle 0.5]

A step of ``prompts_per_step`` training problems with ``group_size`` completions each (every
completion the problem's right body or one of its family's classic bugs, drawn at random as the
built-in coder writes them) is scored by the ``code`` reward, in its sandbox pool of
``workers`` slots, ``--rounds`` times. Reported: the step's rollouts and distinct programs (a
program written twice for a problem runs once), and per program the wall milliseconds of the
reward's call divided by its programs (the median round) and the CPU milliseconds this process
spent on it (building, sending and judging the jobs; the sandbox's own CPU is not counted).
The same step is scored, in alternating rounds, by a second pool whose slots each fork
``--ready`` children ahead of their runs (``ready``; namespaces isolation), both pools left
idle for ``--idle`` seconds before each round as a training step's generation and learning
leave them: its numbers are under ``"ready"``. That idle time is free here only because
nothing else runs in it; in a training run on a machine without spare cores the children
are forked on cores the sampler and learner use (docs/sandbox.md, "Speed"). The machine's
other load moves the wall numbers.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from tempering.build import build_tasks
from tempering.config import load_config
from tempering.rewards.base import build_reward
from tempering.sandbox.executor import MAX_READY
from tempering.tasks.code import CodeTask
from tempering.types import Problem, Rollout


def step_programs(tasks: list[CodeTask], prompts: int, group: int, seed: int) -> tuple[list[Problem], list[str]]:
    """A step's problems (round robin over the tasks) and completions (right or buggy bodies)."""
    rng = random.Random(seed)
    problems, bodies = [], []
    for index in range(prompts):
        task = tasks[index % len(tasks)]
        problem = task.train_problem(seed * prompts + index)
        family = next(f for f in task.families if f.name == problem.meta["family"])
        choices = [task.solution(problem)] + [task.solution(problem, True, bug) for bug in range(len(family.bugs))]
        for _ in range(group):
            problems.append(problem)
            bodies.append(rng.choice(choices))
    return problems, bodies


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="code_reward.py", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="code", help="a config file or shipped config name (default: code)")
    parser.add_argument("--rounds", type=int, default=5, help="times the step is scored (default: 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ready", type=int, default=16,
                        help="children each slot of the second pool forks ahead of its runs (default: 16)")
    parser.add_argument("--idle", type=float, default=0.5,
                        help="seconds both pools sit idle before each round (default: 0.5)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit(f"code_reward.py: --rounds must be at least 1, got {args.rounds}")
    if not 1 <= args.ready <= MAX_READY or args.idle < 0:
        raise SystemExit(f"code_reward.py: --ready must be 1 to {MAX_READY} and --idle at least 0")
    config = load_config(args.config)
    tasks = build_tasks(config)
    if other := [task.name for task in tasks if not (isinstance(task, CodeTask) and task.style == "raw")]:
        raise SystemExit(f"code_reward.py: --config {args.config}: tasks {other} are not raw-style code tasks")
    options = dict(config.rewards.options.get("code") or {})
    reward = build_reward("code", {**options, "ready": 0})
    ahead = build_reward("code", {**options, "ready": args.ready})
    problems, bodies = step_programs(tasks, config.rollout.prompts_per_step, config.rollout.group_size, args.seed)
    rollouts = [Rollout(problem=p, prompt_ids=[], completion_ids=[], logprobs=[], text=body, finish_reason="stop",
                        policy_version=0) for p, body in zip(problems, bodies)]
    programs = len({(p.key, body) for p, body in zip(problems, bodies)})
    rounds, ready_rounds = [], []
    try:
        for _ in range(args.rounds):
            for pool, timings in ((reward, rounds), (ahead, ready_rounds)):
                pool.sandbox()
                time.sleep(args.idle)
                wall, cpu = time.perf_counter(), time.process_time()
                results = pool.score_batch(problems, rollouts)
                timings.append((time.perf_counter() - wall, time.process_time() - cpu))
                if errors := [r.error for r in results if r.error]:
                    raise SystemExit(f"code_reward.py: the sandbox failed on {len(errors)} programs: {errors[0]}")
        sandbox = reward.sandbox()
        report = {"rollouts": len(rollouts), "programs": programs, "workers": sandbox.workers,
                  "isolation": sandbox.isolation, "rounds": args.rounds,
                  "passed": sum(r.score for r in results) / len(results)}
        children = ahead.sandbox().ready
    finally:
        reward.close()
        ahead.close()
    report.update(_timing(rounds, programs))
    report["ready"] = {"children": children, **_timing(ready_rounds, programs)}
    print(json.dumps(report))
    return report


def _timing(rounds: list, programs: int) -> dict:
    wall = statistics.median(w for w, _ in rounds)
    return {"ms_per_program": round(1e3 * wall / programs, 3), "step_s": round(wall, 4),
            "parent_cpu_ms_per_program": round(1e3 * statistics.median(c for _, c in rounds) / programs, 3)}


if __name__ == "__main__":
    main()
