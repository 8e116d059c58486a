"""Outcome reward alone against outcome plus a process reward (a learned process reward model, or
the rule-based ``steps`` reward), on arithmetic whose model reaches right answers through wrong
steps; prints one JSON object.

    python bench/process_rewards.py [--model DIR] [--prm DIR] [--steps 60] [--seeds 0,1,2]
                                    [--arms outcome,prm,steps] [--weight 0.5] [--gate] [--label-problems 120]
                                    [--lucky-sft SHARE] [--sft-records 1200] [--tasks add,sub,mul]
                                    [--process-tasks add,sub] [--out DIR]
                                    [key=value ...]

The model (unless ``--model``): the built-in tiny model's small recipe (:data:`PRETRAIN`: 128
wide, 2 layers, 400 steps of 32 documents, float32; about 4 minutes on one thread) pre-trained
on the quickstart's add, sub and mul with ``corpus_lucky_share`` 0.5: of the corpus's solutions
written with the classic mistake (the dropped carry or borrow), half end with the right answer
anyway. The model so made sometimes writes wrong steps and then the right answer, which an
outcome reward pays in full.

With ``--lucky-sft SHARE`` the policy is instead the model (unless ``--model``: the built-in tiny
model, its default recipe) fine-tuned by ``temper sft`` (4 epochs, lr 1e-3) on ``--sft-records``
worked training problems per task, ``SHARE`` of them written with the classic mistake's steps
and the right answer (:func:`lucky_records`). A pre-trained model writes a wrong step and then
the answer that follows from it; this one has been taught the right answer after the wrong
steps, so an outcome reward cannot tell its lucky solutions from right ones.

The process reward model (unless ``--prm``): ``temper prm label`` on that model's own samples of
``--label-problems`` training problems per task (4 solutions, 4 continuations a step), then
``temper prm train`` on the built-in tiny model (6 epochs, lr 1e-3). Its labels say how often a
step's continuations reach a right answer, so a wrong step after which the right answer is only
sometimes written is valued low. With ``--lucky-sft`` it is labelled on the model before the
fine-tuning: continued by the lucky policy, a wrong step reaches the right answer as often as a
right one, and its labels would call both good.

Arms, the quickstart config otherwise (same seed, steps, batch, evaluation):

- ``outcome``: ``exact_match`` 1 and ``format`` 0.1, the quickstart's rewards;
- ``prm``: those and ``process_model`` at ``--weight`` (``min`` over steps; with ``--gate``
  only where the answer is right, ``gate: exact_match``);
- ``steps``: those and ``steps`` at ``--weight`` (every ``a = b`` line checked, and the answer
  following from them).

Every task's metric is ``exact_steps``, so each evaluation reports held-out accuracy and
``steps_right``, the share of fully correct solutions (right answer, every step holding and
leading to it). Per arm the JSON gives both after training (mean over tasks, then the mean over
seeds and the half-width of its 95% t-interval), their change from before, and per seed; under
``checks``, for each process arm, its ``steps_right`` margin over ``outcome``, the seed spread
(the larger of the two arms' ranges over seeds), whether the margin exceeds it, and the accuracy
difference (within 2 points counts as equal). Runs stay under ``--out`` (a process arm at another
weight than 0.5 in its own folder, ``prm-w0.2-s0``) and a finished run of the same config is read
back (as ``bench/joint.py`` does), so a stopped bench continues and a sweep of ``--weight`` trains
only its process arms.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from joint import earlier_run, interval
from stages import fine_tuned_once, temper

from tempering.config import load_config
from tempering.policy import resolve_model_path
from tempering.tasks.arithmetic import ArithmeticTask
from tempering.train import train

TASKS = ("add", "sub", "mul")
PRETRAIN = ["pretrain.hidden_size=128", "pretrain.layers=2", "pretrain.heads=4", "pretrain.steps=400",
            "pretrain.batch_docs=32", "pretrain.lr=0.003", "pretrain.warmup_steps=20", "pretrain.bf16=false",
            "pretrain.tasks=[" + ", ".join(f"{{name: {t}, options: {{digits: [2], corpus_lucky_share: 0.5}}}}"
                                           for t in TASKS) + "]"]
OUTCOME = {"exact_match": 1.0, "format": 0.1}
EXTRA = {"outcome": None, "prm": "process_model", "steps": "steps"}
DEFAULT_WEIGHT = 0.5


def lucky_model(threads: str) -> str:
    """The small tiny model pre-trained with lucky answers (cached like every built-in model)."""
    config = load_config("quickstart", [*PRETRAIN, threads])
    return str(resolve_model_path("builtin:tiny", config.pretrain, progress=True))


def builtin_tiny(threads: str) -> str:
    """The built-in tiny model by its default recipe (cached like every built-in model)."""
    return str(resolve_model_path("builtin:tiny", load_config("quickstart", [threads]).pretrain, progress=True))


def lucky_records(share: float, count: int, path: Path, tasks: tuple[str, ...] = TASKS) -> None:
    """``count`` worked training problems per task for ``temper sft``, each written with the
    classic mistake's steps and the right answer (:meth:`ArithmeticTask.lucky_solution`) with
    probability ``share``, else rightly; where no carry or borrow is needed both are the same."""
    rng = random.Random(0)
    with path.open("w") as f:
        for name in tasks:
            task = ArithmeticTask(name=name, seed=0, operation=name)
            for index in range(count):
                problem = task.train_problem(index)
                text = task.lucky_solution(problem) if rng.random() < share else task.solution(problem)
                f.write(json.dumps({"prompt": problem.prompt, "completion": text}) + "\n")


def lucky_policy(base: str, share: float, records: int, out: Path, threads: str, tasks: tuple[str, ...] = TASKS) -> str:
    """``base`` fine-tuned on :func:`lucky_records` into ``out/lucky-sft``, unless it finished there
    on the same records (on others: refused, as :func:`earlier_run` refuses another config)."""
    return fine_tuned_once(out / "lucky-sft", lambda path: lucky_records(share, records, path, tasks),
                           "another --lucky-sft, --sft-records or --tasks", "quickstart", f"model.path={base}", threads,
                           "sft.lr=1e-3", "sft.epochs=4", "sft.warmup_steps=3", "checkpoint.every=0")


def trained_prm(model: str, out: Path, problems: int, threads: str) -> str:
    """``out/prm``, labelled on ``model``'s samples and trained, unless it is there already."""
    prm = out / "prm"
    if not (prm / "prm.json").is_file():
        labels = out / "prm-labels.jsonl"
        temper("prm", "label", model, threads, "--problems", str(problems), "--solutions", "4",
               "--continuations", "4", "--out", str(labels), "--quiet")
        temper("prm", "train", str(labels), "--out", str(prm), "--epochs", "6", "--lr", "1e-3",
               "--threads", threads.partition("=")[2] or "1", "--quiet")
    return str(prm)


def arm_overrides(arm: str, weight: float, prm: str | None, gate: bool, tasks: tuple[str, ...] = TASKS,
                  process_tasks: tuple[str, ...] | None = None) -> list[str]:
    """The tasks with the arm's rewards and ``exact_steps`` as their metric; a process arm's
    reward on ``process_tasks`` alone (None: every task), the others keeping the outcome's.

    >>> arm_overrides("steps", 0.5, None, False, ("add", "mul"), ("add",))[0]
    'tasks=[{name: add, options: {digits: [2], metric: exact_steps}, rewards: {exact_match: 1.0, format: 0.1, steps: 0.5}}, {name: mul, options: {digits: [2], metric: exact_steps}, rewards: {exact_match: 1.0, format: 0.1}}]'
    """
    def written(task: str) -> str:
        rewards = dict(OUTCOME)
        if EXTRA[arm] and (process_tasks is None or task in process_tasks):
            rewards[EXTRA[arm]] = weight
        return "{" + ", ".join(f"{name}: {value}" for name, value in rewards.items()) + "}"

    tasks = ", ".join(f"{{name: {t}, options: {{digits: [2], metric: exact_steps}}, rewards: {written(t)}}}"
                      for t in tasks)
    extra = [f"rewards.options.process_model.path={prm}"] if arm == "prm" else []
    if arm == "prm" and gate:
        extra.append("rewards.options.process_model.gate=exact_match")
    return [f"tasks=[{tasks}]", *extra]


def run_name(arm: str, weight: float, seed: int, process_tasks: tuple[str, ...] | None = None) -> str:
    """A run's folder under ``--out``: a process arm at another weight than the default, or on
    some tasks alone, has its own, so that a sweep of ``--weight`` (or ``--process-tasks``) reads
    back the outcome runs and the process runs it has.

    >>> run_name("outcome", 0.2, 1), run_name("prm", 0.5, 1), run_name("prm", 0.2, 1), run_name("prm", 0.5, 1, ("add",))
    ('outcome-s1', 'prm-s1', 'prm-w0.2-s1', 'prm-on-add-s1')
    """
    if arm == "outcome":
        return f"{arm}-s{seed}"
    on = f"-on-{'+'.join(process_tasks)}" if process_tasks is not None else ""
    return f"{arm}{on}-s{seed}" if weight == DEFAULT_WEIGHT else f"{arm}-w{weight:g}{on}-s{seed}"


def one_run(overrides: list[str], run_dir: Path, tasks: tuple[str, ...] = TASKS) -> dict:
    """Accuracy and ``steps_right`` (means over the tasks) before and after, a run read back where it
    finished under the same config."""
    config = load_config("quickstart", [*overrides, f"run_dir={run_dir}"])
    summary = earlier_run(config, run_dir) or train(config, progress=False)

    def means(result: dict) -> dict:
        right = [result["components"][t]["steps_right"] for t in tasks if t in result.get("components", {})]
        return {"accuracy": result["accuracy"], "steps_right": sum(right) / len(right) if right else None}

    return {"before": means(summary["eval_before"]), "after": means(summary["eval_after"]),
            "wall_s": summary["wall_s"]}


def summarize(runs: list[dict], names: tuple[str, ...] = ("accuracy", "steps_right")) -> dict:
    """Per measure of ``names``: its value after training over seeds (mean, 95% half-width, per
    seed) and its change from before."""
    found = {}
    for name in names:
        after = [run["after"][name] for run in runs]
        change = [run["after"][name] - run["before"][name] for run in runs]
        found[name] = {**interval(after), "change": interval(change), "per_seed": after}
    return found


def checks(arms: dict, measure: str = "steps_right") -> dict:
    """Each arm against ``outcome``: the margin of ``measure``, the seed spread (the larger of the
    two arms' ranges over seeds), and the accuracy difference."""
    if "outcome" not in arms:
        return {}
    base = arms["outcome"]
    found = {}
    for arm in (a for a in arms if a != "outcome"):
        margin = arms[arm][measure]["mean"] - base[measure]["mean"]
        spread = max(max(a[measure]["per_seed"]) - min(a[measure]["per_seed"]) for a in (base, arms[arm]))
        accuracy = arms[arm]["accuracy"]["mean"] - base["accuracy"]["mean"]
        found[arm] = {f"{measure}_margin": margin, "seed_spread": spread, "beyond_spread": margin > spread,
                      "accuracy_difference": accuracy, "accuracy_within_2_points": abs(accuracy) <= 0.02}
    return found


def compared(runs: dict[str, list[dict]], measure: str = "steps_right") -> dict:
    """``{"before", "arms", "checks", "wall_s"}`` of each arm's runs (one a seed): accuracy and
    ``measure`` before training (the first arm's mean), each arm's after (:func:`summarize`),
    each arm against ``outcome`` (:func:`checks`) and each arm's training seconds."""
    names = ("accuracy", measure)
    summary = {arm: summarize(found, names) for arm, found in runs.items()}
    before = {name: interval([run["before"][name] for run in next(iter(runs.values()))])["mean"] for name in names}
    return {"before": before, "arms": summary, "checks": checks(summary, measure),
            "wall_s": {arm: sum(run["wall_s"] for run in found) for arm, found in runs.items()}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="the policy; default: the small tiny model pre-trained with lucky answers")
    parser.add_argument("--prm", help="a trained process reward model; default: labelled and trained here")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--arms", default="outcome,prm,steps")
    parser.add_argument("--weight", type=float, default=DEFAULT_WEIGHT, help="the process reward's weight beside the outcome's 1")
    parser.add_argument("--gate", action="store_true", help="pay the PRM's score only to right answers")
    parser.add_argument("--label-problems", type=int, default=120, help="training problems per task to label")
    parser.add_argument("--lucky-sft", type=float, default=0.0,
                        help="fine-tune the policy on worked problems, this share with wrong steps and the right answer; 0: none")
    parser.add_argument("--sft-records", type=int, default=1200, help="--lucky-sft's worked problems per task")
    parser.add_argument("--tasks", default=",".join(TASKS), help="the arithmetic tasks trained and evaluated (and, with "
                        "--lucky-sft, fine-tuned on)")
    parser.add_argument("--process-tasks", help="the tasks a process arm adds its reward to, the others keeping the "
                        "outcome's (default: every task of --tasks)")
    parser.add_argument("--out", default="runs/process-rewards")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every run (threads=1, eval sizes)")
    args = parser.parse_args(argv)
    arms = args.arms.split(",")
    if unknown := sorted(set(arms) - set(EXTRA)):
        raise SystemExit(f"--arms: unknown arm {unknown[0]!r}; the arms are {', '.join(EXTRA)}")
    if args.prm and not (Path(args.prm) / "prm.json").is_file():
        raise SystemExit(f"--prm {args.prm}: not a folder `temper prm train` saved (it holds no prm.json)")
    seeds = [int(s) for s in args.seeds.split(",")]
    tasks = tuple(args.tasks.split(","))
    if unknown := sorted(set(tasks) - set(TASKS)):
        raise SystemExit(f"--tasks: unknown task {unknown[0]!r}; the tasks are {', '.join(TASKS)}")
    process_tasks = tuple(args.process_tasks.split(",")) if args.process_tasks else None
    if process_tasks is not None and (unknown := sorted(set(process_tasks) - set(tasks))):
        raise SystemExit(f"--process-tasks: {unknown[0]!r} is not one of --tasks ({', '.join(tasks)})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    threads = next((o for o in args.overrides if o.startswith("threads=")), "threads=1")
    if not 0 <= args.lucky_sft <= 1:
        raise SystemExit(f"--lucky-sft: a share between 0 and 1, got {args.lucky_sft}")
    base = args.model or (builtin_tiny(threads) if args.lucky_sft else lucky_model(threads))
    model = lucky_policy(base, args.lucky_sft, args.sft_records, out, threads, tasks) if args.lucky_sft else base
    prm = (args.prm or trained_prm(base, out, args.label_problems, threads)) if "prm" in arms else None
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    for seed in seeds:
        for arm in arms:
            overrides = [*args.overrides, f"model.path={model}", f"steps={args.steps}", f"seed={seed}",
                         *arm_overrides(arm, args.weight, prm, args.gate, tasks, process_tasks)]
            runs[arm].append(one_run(overrides, out / run_name(arm, args.weight, seed, process_tasks), tasks))
    report = {"model": model, "base": base, "lucky_sft": args.lucky_sft, "tasks": list(tasks), "prm": prm, "steps": args.steps, "seeds": seeds, "weight": args.weight,
              "gate": args.gate, "process_tasks": list(process_tasks or tasks), **compared(runs), "out": str(out)}
    (out / "process_rewards.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
