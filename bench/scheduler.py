"""Static against adaptive mixtures on the same domains, seed and steps; prints one JSON object.

    python bench/scheduler.py [--config multidomain] [--steps N] [--adaptive learnability] [key=value ...]

Both runs are the config (default ``configs/multidomain.yaml``) with only
``scheduler.strategy`` changed: ``static`` (the tasks' weights) against ``--adaptive``
(default ``learnability``, with the config's floor). Accuracy is the held-out evaluation after
training, greedy, per task; ``mean_accuracy`` averages the tasks and ``worst_accuracy`` is the
lowest. Output::

    {"config": NAME, "steps": N, "before": {"mean_accuracy", "worst_accuracy"},
     "static": {"mean_accuracy", "worst_accuracy", "per_task"}, "adaptive": {...}}

On the built-in tiny model the reasoning-gym domains of ``multidomain`` stay near 0 under
either mixture, so ``worst_accuracy`` compares zeros there; ``--config quickstart`` compares
the mixtures on the arithmetic domains the tiny model can learn.
"""

from __future__ import annotations

import argparse
import json
import tempfile

from tempering.config import builtin_config, load_config
from tempering.models.loading import resolve_model_path
from tempering.train import train


def accuracies(evaluation: dict) -> dict:
    per_task = evaluation["per_task"]
    return {"mean_accuracy": sum(per_task.values()) / len(per_task), "worst_accuracy": min(per_task.values()),
            "per_task": per_task}


def run(config_name: str, strategy: str, steps: int | None, overrides: list[str]) -> dict:
    """One training run with ``strategy``; returns its summary."""
    with tempfile.TemporaryDirectory() as run_dir:
        config = load_config(builtin_config(config_name), [
            *overrides, f"scheduler.strategy={strategy}",
            *([f"steps={steps}"] if steps is not None else []), f"run_dir={run_dir}",
        ])
        resolve_model_path(config.model.path, config.pretrain, progress=False)
        return train(config, progress=False)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="multidomain", help="a built-in config name (default: multidomain)")
    parser.add_argument("--steps", type=int, default=None, help="RL steps per run (default: the config's)")
    parser.add_argument("--adaptive", default="learnability", help="the adaptive strategy to compare")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for both runs")
    args = parser.parse_args(argv)
    static = run(args.config, "static", args.steps, args.overrides)
    adaptive = run(args.config, args.adaptive, args.steps, args.overrides)
    before = accuracies(static["eval_before"])
    del before["per_task"]
    return {"config": args.config, "steps": static["steps"], "adaptive_strategy": args.adaptive, "before": before,
            "static": accuracies(static["eval_after"]), "adaptive": accuracies(adaptive["eval_after"])}


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
