"""What one program costs the ``code`` reward on a step shaped like the config's; prints JSON.

    python bench/code_reward.py [--config code] [--rounds 5] [--seed 0]

A step of ``prompts_per_step`` training problems with ``group_size`` completions each (every
completion the problem's right body or one of its family's classic bugs, drawn at random as the
built-in coder writes them) is scored by the ``code`` reward, in its sandbox pool of
``workers`` slots, ``--rounds`` times. Reported: the step's rollouts and distinct programs (a
program written twice for a problem runs once), and per program the wall milliseconds of the
reward's call divided by its programs (the median round) and the CPU milliseconds this process
spent on it (building, sending and judging the jobs; the sandbox's own CPU is not counted).
The machine's other load moves the wall numbers.
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
    args = parser.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit(f"code_reward.py: --rounds must be at least 1, got {args.rounds}")
    config = load_config(args.config)
    tasks = build_tasks(config)
    if other := [task.name for task in tasks if not (isinstance(task, CodeTask) and task.style == "raw")]:
        raise SystemExit(f"code_reward.py: --config {args.config}: tasks {other} are not raw-style code tasks")
    reward = build_reward("code", config.rewards.options.get("code"))
    problems, bodies = step_programs(tasks, config.rollout.prompts_per_step, config.rollout.group_size, args.seed)
    rollouts = [Rollout(problem=p, prompt_ids=[], completion_ids=[], logprobs=[], text=body, finish_reason="stop",
                        policy_version=0) for p, body in zip(problems, bodies)]
    programs = len({(p.key, body) for p, body in zip(problems, bodies)})
    rounds = []
    try:
        for _ in range(args.rounds):
            wall, cpu = time.perf_counter(), time.process_time()
            results = reward.score_batch(problems, rollouts)
            rounds.append((time.perf_counter() - wall, time.process_time() - cpu))
        if errors := [r.error for r in results if r.error]:
            raise SystemExit(f"code_reward.py: the sandbox failed on {len(errors)} programs: {errors[0]}")
        sandbox = reward.sandbox()
        report = {"rollouts": len(rollouts), "programs": programs, "workers": sandbox.workers,
                  "isolation": sandbox.isolation, "rounds": args.rounds,
                  "passed": sum(r.score for r in results) / len(results)}
    finally:
        reward.close()
    wall = statistics.median(w for w, _ in rounds)
    report.update(ms_per_program=round(1e3 * wall / programs, 3), step_s=round(wall, 4),
                  parent_cpu_ms_per_program=round(1e3 * statistics.median(c for _, c in rounds) / programs, 3))
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
