"""Static against adaptive mixtures on the same domains, seeds and steps; prints one JSON object.

    python bench/scheduler.py [--config quickstart] [--steps N] [--seeds 0,1,2,3,4]
                              [--adaptive learnability] [--adaptive-set key=value ...] [key=value ...]

Each seed trains twice, one arm after the other: the config (``key=value`` overrides apply to
both arms) with ``scheduler.strategy=static``, the tasks' own weights, and with ``--adaptive``
and its ``--adaptive-set`` settings. Nothing else differs: same domains, seed, steps, batch,
learning rate, evaluation. Accuracy is the held-out evaluation after training, greedy, per
task; ``mean_accuracy`` averages the tasks and ``worst_accuracy`` is the lowest task, each
then averaged over the seeds (the per-seed values are under ``per_seed``). ``draws`` is each
task's average share of the training draws.

The defaults (:data:`COMMON`) are the quickstart domains, 2-digit add, sub and mul on the
built-in tiny model, with 8 prompts a step and 100 steps: add and sub are solved within about
20 steps, after which static keeps drawing two thirds of each batch from them, mostly groups
whose rollouts all succeed (no advantage, no signal), while mul, the weakest domain, is still
learning and short of samples at 8 prompts a step. The adaptive arm is ``learnability`` with
its default floor of 0.1. Runs are single-threaded and one at a time; on an idle 2-core
machine the ten runs take about 10-15 minutes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from tempering.config import builtin_config, load_config
from tempering.policy import resolve_model_path
from tempering.train import train

COMMON = ["threads=1", "rollout.prompts_per_step=8", "eval.problems_per_task=100"]
"""Overrides of both arms, before the command line's (which may replace them)."""
DEFAULT_ADAPTIVE_SETTINGS = ["scheduler.floor=0.1"]


def accuracies(evaluation: dict) -> dict:
    per_task = evaluation["per_task"]
    return {"mean_accuracy": sum(per_task.values()) / len(per_task), "worst_accuracy": min(per_task.values()),
            "per_task": per_task}


def draws(metrics_path: Path) -> dict[str, float]:
    """Each task's share of the draws, averaged over the steps (from the run's metrics)."""
    records = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    totals: dict[str, float] = {}
    for record in records:
        for key, value in record.items():
            if key.startswith("domain/") and key.endswith("/weight"):
                task = key.removeprefix("domain/").removesuffix("/weight")
                totals[task] = totals.get(task, 0.0) + value
    return {task: total / max(len(records), 1) for task, total in totals.items()}


def run(config_name: str, overrides: list[str]) -> dict:
    """One training run; returns its summary with the draws added."""
    with tempfile.TemporaryDirectory() as run_dir:
        config = load_config(builtin_config(config_name), [*overrides, f"run_dir={run_dir}"])
        resolve_model_path(config.model.path, config.pretrain, progress=False)
        summary = train(config, progress=False)
        summary["draws"] = draws(Path(run_dir) / "metrics.jsonl")
        return summary


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def average(evaluations: list[dict]) -> dict:
    """Mean and worst accuracy of each run averaged over the runs, and per-task accuracy."""
    per_run = [accuracies(e) for e in evaluations]
    return {"mean_accuracy": _mean([a["mean_accuracy"] for a in per_run]),
            "worst_accuracy": _mean([a["worst_accuracy"] for a in per_run]),
            "per_task": {t: _mean([a["per_task"][t] for a in per_run]) for t in per_run[0]["per_task"]}}


def arm(runs: list[dict]) -> dict:
    """One arm over the seeds: the averages, the draws, and each seed's own numbers."""
    return {**average([r["eval_after"] for r in runs]),
            "draws": {t: _mean([r["draws"].get(t, 0.0) for r in runs]) for t in runs[0]["eval_after"]["per_task"]},
            "per_seed": [{**accuracies(r["eval_after"]), "wall_s": r["wall_s"]} for r in runs]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="quickstart", help="a built-in config name (default: quickstart)")
    parser.add_argument("--steps", type=int, default=100, help="RL steps per run (default: 100)")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds, one static and one adaptive run each")
    parser.add_argument("--adaptive", default="learnability", help="the adaptive strategy to compare")
    parser.add_argument("--adaptive-set", nargs="*", default=DEFAULT_ADAPTIVE_SETTINGS, metavar="KEY=VALUE",
                        help=f"settings of the adaptive arm only (default: {' '.join(DEFAULT_ADAPTIVE_SETTINGS)})")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for both arms")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    common = [*COMMON, *args.overrides, f"steps={args.steps}"]
    start = time.perf_counter()
    static, adaptive = [], []
    for seed in seeds:
        static.append(run(args.config, [*common, f"seed={seed}", "scheduler.strategy=static"]))
        adaptive.append(run(args.config, [*common, f"seed={seed}", f"scheduler.strategy={args.adaptive}",
                                          *args.adaptive_set]))
    static_arm, adaptive_arm = arm(static), arm(adaptive)
    result = {
        "static": static_arm, "adaptive": adaptive_arm, "before": average([r["eval_before"] for r in static]),
        "config": args.config, "steps": args.steps, "seeds": seeds, "overrides": common,
        "adaptive_strategy": args.adaptive, "adaptive_settings": args.adaptive_set,
        "seeds_adaptive_wins_both": sum(a["mean_accuracy"] > s["mean_accuracy"] and a["worst_accuracy"] > s["worst_accuracy"]
                                        for s, a in zip(static_arm["per_seed"], adaptive_arm["per_seed"])),
        "wall_s": time.perf_counter() - start,
    }
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
