"""Base -> SFT -> RL -> inference-time on one real model, each measured on the same held-out
split with ``temper eval``; prints one JSON object and a Markdown table.

    python bench/stages.py [--config smollm2-add] [--rl-run RUN_DIR] [--sft-run RUN_DIR]
                           [--sft-records 2000] [--n 8] [--problems 300]

- base: the config's ``model.path``;
- SFT: ``temper sft`` on ``--sft-records`` worked problems from the training stream of the
  config's first task (never its held-out split), each answered the way the prompt asks
  (``47 + 38 = 85.``); skipped with ``--sft-records 0``;
- RL: ``temper train CONFIG`` from the base model (``--rl-run`` reuses a finished run);
- inference-time, on every model: ``maj@n`` (majority vote of n samples) and
  ``best_of@n[verifier]`` (the task's own grader picks; an oracle, equal to pass@n).

Also reports the best constant answer's accuracy on the split (the share of held-out problems
whose answer is the most common one), so that a gain can be told from learning one answer.
Each stage's numbers come from ``temper eval``'s JSON, saved beside the runs in ``--out``.

A code config (``--config smollm2-code``, a chat-style ``code`` first task) has no SFT
records and no constant answer (each problem is a function); ``--n 0`` measures greedy only,
the number the run's own before/after table holds, for configs whose sampling is costly.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path

from tempering.build import build_tasks
from tempering.config import load_config
from tempering.tasks.arithmetic import OPERATIONS, ArithmeticTask
from tempering.tasks.code import CodeTask


def temper(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "tempering.cli", *args], check=True)


def evaluate(model: str, config: str, problems: int, n: int, out: Path) -> dict:
    """``temper eval``'s metrics for the config's first task: greedy, pass@1, maj@n, best-of-n
    (greedy only for ``n`` = 0)."""
    if not out.exists():
        sampled = ["--n", str(n), "--k", f"1,{n}", "--best-of", "verifier"] if n else []
        temper("eval", model, config, "--problems", str(problems), *sampled, "--json", str(out), "--quiet")
    result = json.loads(out.read_text())
    task, metrics = next(iter(result["metrics"].items()))
    keep = ("greedy", "pass@1", f"maj@{n}", f"best_of@{n}[verifier]")
    return {"task": task, "truncated": result.get("truncated", {}).get(task),
            **{name: metrics[name] for name in keep if name in metrics}}


def first_task(config_name: str):
    """The config's first task, which the stages train and measure; SFT records are written
    for the built-in arithmetic tasks only (their problems carry their operands)."""
    task = build_tasks(load_config(config_name))[0]
    if not isinstance(task, (ArithmeticTask, CodeTask)) or task.style != "chat":
        raise SystemExit(f"{config_name}: the first task must be a chat-style add, sub, mul or code task")
    return task


def sft_records(task: ArithmeticTask, count: int, path: Path) -> None:
    """Worked training problems, answered as ``a op b = c.``."""
    with path.open("w") as f:
        for i in range(count):
            problem = task.train_problem(i)
            a, b, op = problem.meta["a"], problem.meta["b"], OPERATIONS[task.operation].symbol
            answer = {"role": "assistant", "content": f"{a} {op} {b} = {problem.answer}."}
            f.write(json.dumps({"messages": [*problem.prompt, answer]}) + "\n")


def constant_answer_accuracy(task: ArithmeticTask, problems: int) -> float | None:
    """None for a code task, whose answers are programs, not values one constant could match."""
    if isinstance(task, CodeTask):
        return None
    answers = collections.Counter(p.answer for p in task.eval_problems(problems))
    return answers.most_common(1)[0][1] / sum(answers.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="smollm2-add")
    parser.add_argument("--rl-run", help="a finished `temper train CONFIG` run folder to reuse")
    parser.add_argument("--sft-run", help="a finished `temper sft` run folder to reuse")
    parser.add_argument("--sft-records", type=int, default=2000)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--problems", type=int, default=300)
    parser.add_argument("--out", default="stages")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_path = load_config(args.config).model.path
    task = first_task(args.config)
    if isinstance(task, CodeTask) and args.sft_records and not args.sft_run:
        raise SystemExit(f"{args.config}: SFT records are written for arithmetic tasks only; pass --sft-records 0")
    if args.n < 0:
        raise SystemExit(f"--n {args.n}: samples per problem must be 0 (greedy only) or more")
    stages, seconds = {}, {}

    t0 = time.perf_counter()
    stages["base"] = evaluate(model_path, args.config, args.problems, args.n, out / "eval_base.json")
    seconds["base eval"] = time.perf_counter() - t0

    if args.sft_records or args.sft_run:
        sft_run = Path(args.sft_run or out / "sft")
        if not args.sft_run and not (sft_run / "summary.json").exists():
            t0 = time.perf_counter()
            sft_records(task, args.sft_records, out / "sft.jsonl")
            temper("sft", str(out / "sft.jsonl"), args.config, "--run-dir", str(sft_run), "--quiet")
            seconds["sft"] = time.perf_counter() - t0
        stages["sft"] = evaluate(str(sft_run), args.config, args.problems, args.n, out / "eval_sft.json")

    rl_run = Path(args.rl_run or out / "rl")
    if not args.rl_run and not (rl_run / "summary.json").exists():
        t0 = time.perf_counter()
        temper("train", args.config, "--run-dir", str(rl_run), "--quiet")
        seconds["rl"] = time.perf_counter() - t0
    stages["rl"] = evaluate(str(rl_run), args.config, args.problems, args.n, out / "eval_rl.json")

    report = {"config": args.config, "n": args.n, "problems": args.problems,
              "best_constant_answer": constant_answer_accuracy(task, args.problems),
              "run_table": run_table(rl_run, stages["base"]["task"]),
              "stages": stages, "seconds": {k: round(v) for k, v in seconds.items()}}
    print(json.dumps(report, indent=2))
    print(table(report), file=sys.stderr)


def run_table(rl_run: Path, task: str) -> dict:
    """The RL run's own greedy accuracy on ``task`` before and after (its ``summary.json``),
    which ``temper eval``'s base and rl greedy numbers should repeat."""
    summary = json.loads((rl_run / "summary.json").read_text())
    return {when: summary[f"eval_{when}"]["per_task"].get(task) for when in ("before", "after")}


def table(report: dict) -> str:
    n = report["n"]
    columns = ("greedy", "pass@1", f"maj@{n}", f"best_of@{n}[verifier]") if n else ("greedy",)
    lines = ["| stage | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for stage, metrics in report["stages"].items():
        cells = [f"{100 * metrics[c]['value']:.1f}% [{100 * metrics[c]['ci'][0]:.0f}, {100 * metrics[c]['ci'][1]:.0f}]"
                 if c in metrics else "" for c in columns]
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
