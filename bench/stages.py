"""Base -> SFT -> preference (DPO) -> RL -> inference-time on one real model, each measured on
the same held-out split with ``temper eval``; prints one JSON object and a Markdown table.

    python bench/stages.py [--config smollm2-add] [--rl-run RUN_DIR] [--sft-run RUN_DIR]
                           [--dpo-run RUN_DIR] [--sft-records 2000] [--dpo-pairs 1200]
                           [--rl-from base|sft|dpo] [--prm PRM_DIR] [--n 8] [--problems 300]
                           [--out DIR] [key=value ...]

- base: the config's ``model.path``;
- SFT: ``temper sft`` on ``--sft-records`` worked problems from the training stream of the
  config's first task (never its held-out split), each answered the way the prompt asks
  (``47 + 38 = 85.`` for a chat task, the worked solution for a raw one); skipped with
  ``--sft-records 0``;
- DPO: ``temper dpo`` on ``--dpo-pairs`` pairs from the same training stream, the right
  answer over the one with the task's classic mistake (the dropped carry), written as the SFT
  records are; from the SFT model when that stage ran, else from the base; skipped with
  ``--dpo-pairs 0``;
- RL: ``temper train CONFIG`` from ``--rl-from`` (the base model by default, so that RL is
  seen from the reward alone; ``dpo`` chains the stages) (``--rl-run`` reuses a finished run);
- inference-time, on every model: ``maj@n`` (majority vote of n samples),
  ``best_of@n[verifier]`` (the task's own grader picks; an oracle, equal to pass@n) and, with
  ``--prm``, ``best_of@n[prm]`` (a ``temper prm train`` model picks; no oracle).

``key=value`` overrides go to every ``temper`` command (``threads=1``, a smaller eval).

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
from collections.abc import Callable
from pathlib import Path

from tempering.build import build_tasks
from tempering.config import load_config
from tempering.tasks.arithmetic import OPERATIONS, ArithmeticTask
from tempering.tasks.code import CodeTask


def temper(*args: str) -> None:
    """Run a temper command; its printed tables go to stderr, so that stdout holds only the JSON."""
    subprocess.run([sys.executable, "-m", "tempering.cli", *args], check=True, stdout=sys.stderr)


def fine_tuned_once(run: Path, write: Callable[[Path], None], others: str, *sft_args: str) -> str:
    """``temper sft`` (with ``sft_args``) on the records ``write`` puts in a file, into ``run``,
    the records kept beside it (``run`` + ``.jsonl``); where ``run`` finished on the same records it
    is read back, and on others refused (``others`` says which options make them), so that a
    stopped bench continues and never trains on a policy it did not ask for."""
    data, wanted = run.with_suffix(".jsonl"), run.parent / f"{run.name}.next.jsonl"
    write(wanted)
    if (run / "summary.json").is_file():
        same = data.is_file() and data.read_bytes() == wanted.read_bytes()
        wanted.unlink()
        if not same:
            raise SystemExit(f"bench: {run} was fine-tuned on other records ({others}); give another --out or remove it")
        return str(run / "checkpoint-final")
    wanted.replace(data)
    temper("sft", str(data), *sft_args, "--run-dir", str(run), "--quiet")
    return str(run / "checkpoint-final")


def columns(n: int, prm: bool) -> tuple[str, ...]:
    """The metrics each stage reports: greedy, and with ``n`` samples pass@1, maj@n and best-of-n."""
    if not n:
        return ("greedy",)
    return ("greedy", "pass@1", f"maj@{n}", f"best_of@{n}[verifier]") + ((f"best_of@{n}[prm]",) if prm else ())


def evaluate(model: str, config: str, args: argparse.Namespace, out: Path) -> dict:
    """``temper eval``'s metrics for the config's first task (greedy only for ``--n 0``)."""
    if not out.exists():
        n = args.n
        sampled = ["--n", str(n), "--k", f"1,{n}", "--best-of", "verifier"] if n else []
        if n and args.prm:
            sampled += ["--best-of", f"prm:{args.prm}"]
        temper("eval", model, config, *args.overrides, "--problems", str(args.problems), *sampled,
               "--json", str(out), "--quiet")
    result = json.loads(out.read_text())
    task, metrics = next(iter(result["metrics"].items()))
    return {"task": task, "truncated": result.get("truncated", {}).get(task),
            **{name: metrics[name] for name in columns(args.n, bool(args.prm)) if name in metrics}}


def first_task(config_name: str, overrides: list[str]):
    """The config's first task, which the stages train and measure; SFT records and pairs are
    written for the built-in arithmetic tasks only (their problems carry their operands)."""
    task = build_tasks(load_config(config_name, overrides))[0]
    chat = isinstance(task, (ArithmeticTask, CodeTask)) and task.style == "chat"
    if not (chat or isinstance(task, ArithmeticTask) and task.style == "raw"):
        raise SystemExit(f"{config_name}: the first task must be a chat-style add, sub, mul or code task, "
                         "or a raw add, sub or mul task (the built-in models')")
    return task


def answer(task: ArithmeticTask, problem, buggy: bool = False) -> str:
    """What a model should write after the prompt: ``a op b = c.`` for a chat task (what its
    prompt asks), the worked solution for a raw one; ``buggy`` with the task's classic mistake."""
    if task.style == "raw":
        return task.solution(problem, buggy)
    a, b = problem.meta["a"], problem.meta["b"]
    value = OPERATIONS[task.operation].solve(a, b, True)[1] if buggy else problem.answer
    return f"{a} {OPERATIONS[task.operation].symbol} {b} = {value}."


def as_turn(task: ArithmeticTask, text: str):
    return [{"role": "assistant", "content": text}] if task.style == "chat" else text


def sft_records(task: ArithmeticTask, count: int, path: Path) -> None:
    """Worked training problems, each answered as :func:`answer` writes it."""
    with path.open("w") as f:
        for i in range(count):
            problem = task.train_problem(i)
            if task.style == "chat":
                record = {"messages": [*problem.prompt, *as_turn(task, answer(task, problem))]}
            else:
                record = {"prompt": problem.prompt, "completion": answer(task, problem)}
            f.write(json.dumps(record) + "\n")


def preference_pairs(task: ArithmeticTask, count: int, path: Path) -> None:
    """Training problems where the classic mistake shows: the right answer over the mistaken one."""
    with path.open("w") as f:
        written, index = 0, 0
        while written < count:
            problem = task.train_problem(index)
            index += 1
            right, wrong = answer(task, problem), answer(task, problem, buggy=True)
            if right != wrong:
                f.write(json.dumps({"prompt": problem.prompt, "chosen": as_turn(task, right),
                                    "rejected": as_turn(task, wrong)}) + "\n")
                written += 1
            if index > 100 * count + 1000:
                raise SystemExit(f"{task.name}: too few problems where the classic mistake shows")


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
    parser.add_argument("--dpo-run", help="a finished `temper dpo` run folder to reuse")
    parser.add_argument("--sft-records", type=int, default=2000)
    parser.add_argument("--dpo-pairs", type=int, default=1200)
    parser.add_argument("--rl-from", choices=("base", "sft", "dpo"), default="base")
    parser.add_argument("--prm", help="a `temper prm train` model: adds best-of-n picked by it")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--problems", type=int, default=300)
    parser.add_argument("--out", default="stages")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every temper command")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_path = load_config(args.config, args.overrides).model.path
    task = first_task(args.config, args.overrides)
    preference = args.dpo_pairs or args.dpo_run
    if isinstance(task, CodeTask) and (args.sft_records and not args.sft_run or args.dpo_pairs and not args.dpo_run):
        raise SystemExit(f"{args.config}: SFT records and pairs are written for arithmetic tasks only; "
                         "pass --sft-records 0 --dpo-pairs 0")
    if args.n < 0:
        raise SystemExit(f"--n {args.n}: samples per problem must be 0 (greedy only) or more")
    if args.prm and not args.n:
        raise SystemExit("--prm picks among samples: give --n 2 or more")
    if args.rl_from != "base" and not (args.sft_records or args.sft_run if args.rl_from == "sft" else preference):
        raise SystemExit(f"--rl-from {args.rl_from}: that stage is skipped")
    stages, seconds, models = {}, {}, {"base": model_path}

    def stage(name: str, run: Path, command: list[str]) -> None:
        """Train ``run`` with ``command`` unless it finished, then evaluate its final checkpoint."""
        if not (run / "summary.json").exists():
            t0 = time.perf_counter()
            temper(*command, *args.overrides, "--run-dir", str(run), "--quiet")
            seconds[name] = time.perf_counter() - t0
        models[name] = str(run / "checkpoint-final")
        stages[name] = evaluate(str(run), args.config, args, out / f"eval_{name}.json")

    t0 = time.perf_counter()
    stages["base"] = evaluate(model_path, args.config, args, out / "eval_base.json")
    seconds["base eval"] = time.perf_counter() - t0

    if args.sft_records or args.sft_run:
        if not args.sft_run:
            sft_records(task, args.sft_records, out / "sft.jsonl")
        stage("sft", Path(args.sft_run or out / "sft"), ["sft", str(out / "sft.jsonl"), args.config])
    if preference:
        if not args.dpo_run:
            preference_pairs(task, args.dpo_pairs, out / "pairs.jsonl")
        start = models.get("sft", model_path)
        stage("dpo", Path(args.dpo_run or out / "dpo"),
              ["dpo", str(out / "pairs.jsonl"), args.config, f"model.path={start}"])
    rl_run = Path(args.rl_run or out / "rl")
    stage("rl", rl_run, ["train", args.config, f"model.path={models[args.rl_from]}"])

    report = {"config": args.config, "n": args.n, "problems": args.problems, "rl_from": args.rl_from,
              "prm": args.prm, "best_constant_answer": constant_answer_accuracy(task, args.problems),
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
    shown = columns(report["n"], bool(report["prm"]))
    lines = ["| stage | " + " | ".join(shown) + " |", "|---" * (len(shown) + 1) + "|"]
    for stage, metrics in report["stages"].items():
        cells = [f"{100 * metrics[c]['value']:.1f}% [{100 * metrics[c]['ci'][0]:.0f}, {100 * metrics[c]['ci'][1]:.0f}]"
                 if c in metrics else "" for c in shown]
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
