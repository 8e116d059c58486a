"""On-policy distillation against RL alone on the built-in models: held-out accuracy against steps.

    python bench/distill.py [--steps N] [--every K] [--runs rl,distill] [key=value ...]

``rl`` is ``configs/quickstart.yaml`` (GRPO on the task reward), ``distill`` is
``configs/distill.yaml`` (the same student, tasks and learner, taught token by token by a larger
tiny model pre-trained on a clean corpus); ``distill_task`` is ``distill`` with the task
reward's GRPO advantage added (``algorithm.teacher.task_weight=1``). Every run has the same
seed and ``--steps``, is evaluated greedily on the same held-out problems every ``--every``
steps, and takes the overrides, as for ``temper train``. Output::

    {"steps": N, "every": K,
     "teacher": {"model": PATH, "accuracy": float, "per_task": {...}},
     "runs": {NAME: {"curve": [{"step", "accuracy", "per_task", "train_s"}, ...], "teacher_kl": [...],
                     "wall_s": float}}}

``train_s`` is the wall time of the training steps so far (sampling, rewards, learning, the
teacher's pass), without evaluations or the one-off pre-trainings; ``teacher_kl`` is each
step's per-token reverse KL of the student to the teacher on that step's samples (distillation
runs only); ``wall_s`` is the whole run with its evaluations.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tempering.build import build_tasks
from tempering.config import TrainConfig, builtin_config, load_config
from tempering.eval.greedy import evaluate
from tempering.models.device import resolve_device
from tempering.policy import load_policy, resolve_model_path
from tempering.rollout.hf import HFGenerator
from tempering.train import train

RUNS = {
    "rl": ("quickstart", []),
    "distill": ("distill", []),
    "distill_task": ("distill", ["algorithm.teacher.task_weight=1.0"]),
}


def curve(records: list[dict], summary: dict) -> list[dict]:
    """Accuracy (mean and per task) before training, at each periodic evaluation and after,
    with the training time spent to reach it."""
    def point(step: int, evaluation: dict, train_s: float) -> dict:
        return {"step": step, "accuracy": evaluation["accuracy"], "per_task": evaluation["per_task"],
                "train_s": train_s}

    points = [point(0, summary["eval_before"], 0.0)]
    train_s = 0.0
    for record in records:
        train_s += record["step_s"]
        if "eval/accuracy" in record:
            per_task = {name: record[f"eval/{name}"] for name in summary["eval_before"]["per_task"]}
            points.append(point(record["step"], {"accuracy": record["eval/accuracy"], "per_task": per_task}, train_s))
    points.append(point(summary["steps"], summary["eval_after"], train_s))
    return points


def run(name: str, steps: int, every: int, overrides: list[str]) -> dict:
    """One run of ``RUNS[name]``; its accuracy curve, reverse KL to the teacher and wall time."""
    config_name, extra = RUNS[name]
    with tempfile.TemporaryDirectory() as run_dir:
        config = load_config(builtin_config(config_name), [
            *extra, *overrides, f"steps={steps}", f"eval.every={every}", f"run_dir={run_dir}"])
        resolve_model_path(config.model.path, config.pretrain)  # pre-trainings are not part of the run's time
        summary = train(config, progress=False)
        records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return {"curve": curve(records, summary), "teacher_kl": [r["teacher_kl"] for r in records if "teacher_kl" in r],
            "wall_s": summary["wall_s"]}


def teacher_accuracy(config: TrainConfig) -> dict:
    """The teacher's own greedy held-out accuracy, on the runs' tasks and problems and the
    runs' device."""
    tc, ec = config.algorithm.teacher, config.eval
    model, tokenizer, path = load_policy(tc.path, tc.dtype, tc.pretrain, device=resolve_device(config.model.device))
    generator = HFGenerator(model, tokenizer, config.model.chat_template, ec.batch_size)
    result = evaluate(generator, build_tasks(config), ec.problems_per_task, ec.max_new_tokens, config.rewards.options)
    return {"model": path, "accuracy": result["accuracy"], "per_task": result["per_task"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150, help="RL steps per run")
    parser.add_argument("--every", type=int, default=25, help="evaluate every this many steps")
    parser.add_argument("--runs", default="rl,distill", help=f"comma-separated, of {', '.join(RUNS)}")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for every run")
    args = parser.parse_args(argv)
    teacher = teacher_accuracy(load_config(builtin_config("distill"), args.overrides))
    runs = {name: run(name, args.steps, args.every, args.overrides) for name in args.runs.split(",")}
    return {"steps": args.steps, "every": args.every, "teacher": teacher, "runs": runs}


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
