"""The repository gym's own costs, with the model left out; prints JSON.

    python bench/repo_gym.py [--instances 24] [--levels 1,2,3] [--workers 0] [--ready 0] [--seed 0]

Each of ``--instances`` generated ``repo`` instances (the task's training stream, every family,
the ``--levels`` drawn) is played by a scripted agent through ``env: repo`` exactly as a model's
turns are: list the files, read the module the reference fix touches, run the visible tests,
apply the reference fix as a unified diff, run the tests again, submit. The episode is then
graded by the ``repo`` reward in its clean box. Reported:

- ``episodes_per_min``: episodes played and graded a minute, the environment's and grader's
  time only (no sampling), one episode after another;
- ``setup_ms``: an episode's workspace set-up (``reset``), p50 and p95;
- ``test_run_ms``: one visible-test run (``<test>``), p50 and p95;
- ``grade_ms``: the clean-box grading of one patch (replay, diff, fresh copy, one sandbox job per
  test id), p50 and p95; ``tests_own_ms``: the same test functions' own run time, each timed
  around its call inside one sandbox job that holds the graded files (the time the tests
  themselves run); ``grading_overhead_ms``: ``grade_ms`` minus ``tests_own_ms`` per
  instance, and ``setup_plus_grading_overhead_ms`` with the set-up added, p50 and p95
  (``grading_overhead_ms_per_test_id``: the overhead divided by the instance's test ids, each
  one sandbox job);
- ``sandbox_cpu_ms_per_episode``: CPU the sandbox's processes (this process's descendants: the
  pools' workers and the jobs they reaped) spent per episode, its test runs and its grading;
- ``solved``: the share of episodes the grader scored 1 (the reference fix: 1.0 unless a
  generated instance is wrong).

Both pools have ``--workers`` slots (default 0: the sandbox's own default, one a core, as a
training run's pool has; with 1 the jobs of one grading run one after another). The machine's other load moves
the wall numbers; the CPU column less so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from tempering.envs.reflection import shared_grader
from tempering.envs.repo import RepoEnv
from tempering.rewards.repo import RepoReward, grading_program, graded_files
from tempering.rewards.repo_patch import touched_paths
from tempering.rewards.repo_workspace import format_call, record_of
from tempering.sandbox.spec import RunRequest
from tempering.tasks.repo import RepoTask
from tempering.types import Rollout, Turn

_TIMED = '''

import time as _time
_own = []
for _test_id in {test_ids!r}:
    _path, _, _name = _test_id.partition("::")
    _start = _time.perf_counter()
    try:
        repo_test(_path, _name, "")
    except BaseException:
        pass
    _own.append(_time.perf_counter() - _start)
print(json.dumps(_own))
'''


def scripted_turns(record: dict) -> list[str]:
    """The agent's turns: look, read, test, fix (the reference diff), test, submit."""
    touched = [path for path in touched_paths(record["patch"]) if path in record["files"]]
    return [format_call("ls"), format_call("read", touched[0] if touched else ""), format_call("test"),
            format_call("patch", "\n" + record["patch"]), format_call("test"), format_call("submit")]


def sandbox_cpu_s() -> float:
    """User and system CPU of this process's descendants, with what they reaped (from /proc)."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        times[pid] = sum(int(value) for value in fields[11:15]) / tick
    total, todo = 0.0, list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50": round(statistics.median(ordered), 2), "p95": round(p95, 2)}


def play(env: RepoEnv, problem) -> tuple[Rollout, float, list[float]]:
    """One scripted episode: its rollout (turns as the runner records them), the set-up
    seconds and each test run's seconds."""
    start = time.perf_counter()
    env.reset(problem)
    setup = time.perf_counter() - start
    turns, test_runs = [], []
    for text in scripted_turns(record_of(problem)):
        start = time.perf_counter()
        step = env.step(text)
        if step.info.get("test_runs"):
            test_runs.append(time.perf_counter() - start)
        turns.append(Turn(text=text, start=0, end=0, finish_reason="stop", info=dict(step.info)))
        if step.done:
            break
    rollout = Rollout(problem=problem, prompt_ids=[], completion_ids=[], logprobs=[],
                      text="".join(turn.text for turn in turns), finish_reason="stop", policy_version=0, turns=turns)
    return rollout, setup, test_runs


def tests_own_s(reward: RepoReward, record: dict) -> float:
    """The graded tests' own run time: each test function timed around its call, in one job."""
    test_ids = list(record["FAIL_TO_PASS"]) + list(record.get("PASS_TO_PASS", []))
    program = grading_program(graded_files(record, record["patch"])) + _TIMED.format(test_ids=test_ids)
    result = reward.sandbox().run(RunRequest(program))
    if result.status != "ok":
        raise SystemExit(f"repo_gym.py: the timing job ended {result.status}: {result.stderr[-500:]}")
    return sum(json.loads(result.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="repo_gym.py", description=__doc__.split("\n")[0])
    parser.add_argument("--instances", type=int, default=24, help="episodes played and graded (default: 24)")
    parser.add_argument("--levels", default="1,2,3", help="instance levels drawn, comma-separated (default: 1,2,3)")
    parser.add_argument("--workers", type=int, default=0,
                        help="slots of each sandbox pool; 0 = one a core, the sandbox's default (default: 0)")
    parser.add_argument("--ready", type=int, default=0,
                        help="children each slot forks ahead of its jobs (the code reward's ready option; default: 0)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.instances < 1 or args.workers < 0 or args.ready < 0:
        raise SystemExit("repo_gym.py: --instances must be at least 1, --workers and --ready at least 0")
    try:
        levels = [int(level) for level in args.levels.split(",")]
        task = RepoTask("repo", seed=args.seed, levels=levels)
    except ValueError as err:
        raise SystemExit(f"repo_gym.py: --levels {args.levels!r}: {err}") from None
    pool = {"workers": args.workers, "ready": args.ready}
    env = RepoEnv(sandbox=pool)
    tests_pool = shared_grader("code", pool)  # the pool env: repo's test runs use
    reward = RepoReward(**pool)
    problems = [task.train_problem(index) for index in range(args.instances)]
    setups, test_runs, grades, owns, solved = [], [], [], [], []
    try:
        tests_pool.sandbox(), reward.sandbox()  # pools started before the clocks do
        cpu, wall = sandbox_cpu_s(), time.perf_counter()
        for problem in problems:
            rollout, setup, runs = play(env, problem)
            start = time.perf_counter()
            [result] = reward.score_batch([problem], [rollout])
            grades.append(time.perf_counter() - start)
            if result.error:
                raise SystemExit(f"repo_gym.py: grading failed on {problem.id}: {result.error}")
            setups.append(setup)
            test_runs.extend(runs)
            solved.append(result.score)
        wall, cpu = time.perf_counter() - wall, sandbox_cpu_s() - cpu
        owns = [tests_own_s(reward, record_of(problem)) for problem in problems]
        workers = reward.sandbox().workers
        isolation = reward.sandbox().isolation
    finally:
        reward.close()
        tests_pool.close()
    ms = lambda values: [1e3 * v for v in values]  # noqa: E731
    overhead = [g - o for g, o in zip(grades, owns)]
    ids = [len(record_of(p)["FAIL_TO_PASS"]) + len(record_of(p).get("PASS_TO_PASS", [])) for p in problems]
    report = {
        "instances": args.instances, "levels": levels, "workers": workers, "ready": args.ready, "isolation": isolation,
        "solved": sum(solved) / len(solved),
        "episodes_per_min": round(60 * len(problems) / wall, 1),
        "setup_ms": quantiles(ms(setups)), "test_run_ms": quantiles(ms(test_runs)),
        "grade_ms": quantiles(ms(grades)), "tests_own_ms": quantiles(ms(owns)),
        "grading_overhead_ms": quantiles(ms(overhead)),
        "setup_plus_grading_overhead_ms": quantiles(ms([s + o for s, o in zip(setups, overhead)])),
        "test_ids_per_instance": statistics.mean(ids),
        "grading_overhead_ms_per_test_id": quantiles([1e3 * o / n for o, n in zip(overhead, ids)]),
        "sandbox_cpu_ms_per_episode": round(1e3 * cpu / len(problems), 1),
    }
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
