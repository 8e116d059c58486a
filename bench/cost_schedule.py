"""Scheduling by cost against scheduling by signal alone, on the same domains: the wall time each
takes to reach the signal-only run's final held-out accuracy; prints one JSON object.

    python bench/cost_schedule.py [--config joint] [--model builtin:generalist] [--steps N]
                                  [--eval-every K] [--seeds 0,1,2] [--out DIR] [key=value ...]

Two arms, the same config, seed, steps, batch and evaluation; only the strategy differs:

- ``learnability``: draws follow each domain's within-group success variance (the joint
  config's adaptive mixture);
- ``per_cost``: ``learnability_per_cost``, the same score divided by what a rollout of the domain
  costs (its completion tokens x the measured seconds per generated token, plus its reward
  seconds), so the step's seconds go where signal per second is highest.

Every run evaluates held-out every ``--eval-every`` steps. A run's clock is its training time,
the sum of its steps' ``step_s`` (evaluations excluded, since both arms evaluate the same
problems). The target of a seed is the ``learnability`` run's final mean held-out accuracy; the
JSON gives, per seed, each arm's curve (training seconds, accuracy), the training seconds at
which ``per_cost`` first reached the target (``null`` if it never did, with the accuracy it
ended at) and its ratio to the ``learnability`` run's whole training time. Arms alternate which
runs first from seed to seed (interleaved), so a machine busier in one half of the bench
weighs on both. Run folders stay under ``--out``; a run that finished under the same config is
read back (as ``bench/joint.py`` does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from distill import curve
from joint import COMMON, earlier_run, interval

from tempering.config import load_config
from tempering.policy import resolve_model_path
from tempering.train import train

ARMS = {"learnability": ["scheduler.strategy=learnability"], "per_cost": ["scheduler.strategy=learnability_per_cost"]}


def accuracy_curve(run_dir: Path, summary: dict) -> list[tuple[float, float]]:
    """(training seconds, mean held-out accuracy) at every evaluation: before, every K steps, after."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(point["train_s"], point["accuracy"]) for point in curve(records, summary)]


def one_run(config_name: str, overrides: list[str], run_dir: Path) -> list[tuple[float, float]]:
    config = load_config(config_name, [*overrides, f"run_dir={run_dir}"])
    summary = earlier_run(config, run_dir)
    if summary is None:
        resolve_model_path(config.model.path, config.pretrain, progress=True)
        summary = train(config, progress=False)
    return accuracy_curve(run_dir, summary)


def first_reach(points: list[tuple[float, float]], target: float) -> float | None:
    """Training seconds at the first evaluation at or above ``target``."""
    return next((seconds for seconds, accuracy in points if accuracy >= target), None)


def compare(curves: dict[str, list[tuple[float, float]]]) -> dict:
    """One seed: the target, when ``per_cost`` reached it, and its share of the reference's time."""
    reference, candidate = curves["learnability"], curves["per_cost"]
    target, total = reference[-1][1], reference[-1][0]
    reached = first_reach(candidate, target)
    return {"target": target, "learnability_s": total, "per_cost_s_to_target": reached,
            "per_cost_final": candidate[-1][1], "per_cost_total_s": candidate[-1][0],
            "time_ratio": reached / total if reached is not None and total > 0 else None, "curves": curves}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="joint", help="a config (default: the shipped joint config)")
    parser.add_argument("--model", help="model.path of every run (default: the config's, builtin:generalist)")
    parser.add_argument("--steps", type=int, help="RL steps per run (default: the config's)")
    parser.add_argument("--eval-every", type=int, default=10, help="held-out evaluation every K steps (default 10)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, both arms once each (default 0,1,2)")
    parser.add_argument("--out", type=Path, help="folder for the runs (default: a new one under runs/)")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides of both arms")
    args = parser.parse_args(argv)
    out = args.out or Path("runs") / time.strftime("bench-cost-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    common = [*COMMON, f"eval.every={args.eval_every}", *args.overrides,
              *([f"model.path={args.model}"] if args.model else []),
              *([f"steps={args.steps}"] if args.steps is not None else [])]
    start, seeds = time.perf_counter(), [int(s) for s in args.seeds.split(",")]
    per_seed = []
    for i, seed in enumerate(seeds):
        order = list(ARMS) if i % 2 == 0 else list(reversed(ARMS))
        curves = {}
        for arm in order:
            print(f"cost bench: seed {seed}, arm {arm}", file=sys.stderr, flush=True)
            curves[arm] = one_run(args.config, [*common, f"seed={seed}", *ARMS[arm]], out / f"{arm}-seed{seed}")
        per_seed.append({"seed": seed, "order": order, **compare(curves)})
    ratios = [s["time_ratio"] for s in per_seed if s["time_ratio"] is not None]
    result = {"config": args.config, "overrides": common, "seeds": seeds, "per_seed": per_seed,
              "reached": f"{len(ratios)}/{len(per_seed)}",
              "time_ratio_median": statistics.median(ratios) if ratios else None,
              "time_ratio": interval(ratios) if ratios else None,
              "final": {arm: interval([s["curves"][arm][-1][1] for s in per_seed]) for arm in ARMS},
              "wall_s": time.perf_counter() - start, "out": str(out)}
    (out / "cost_schedule.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
