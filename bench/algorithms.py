"""The quickstart job once per advantage estimator, side by side; prints one JSON object.

    python bench/algorithms.py [--steps N] [--estimators grpo,rloo,...] [key=value ...]

Every run is ``configs/quickstart.yaml`` with the same seed and number of steps (default:
the config's), DAPO dynamic sampling on (so that ``dropped_fraction``, the share of sampled
groups dropped for having all-equal rewards, is measured) and only
``algorithm.advantage`` changed; overrides apply to every run as for ``temper train``. Each
estimator keeps every other default (ppo_clip, token_mean), so Dr. GRPO runs without its
``token_sum_norm`` aggregation unless asked. Output::

    {"steps": N, "accuracy_before": float,
     "results": {NAME: {"accuracy_after", "s_per_step", "dropped_fraction",
                        "zero_signal_fraction", "sampling_rounds"}}}

``s_per_step`` is the wall time of a training step (sampling rounds, rewards, learning);
evaluations and the tiny model's one-off pre-training are not in it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from tempering.config import builtin_config, load_config
from tempering.policy import resolve_model_path
from tempering.train import train

ESTIMATORS = ["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"]


def run(estimator: str, steps: int | None, overrides: list[str]) -> tuple[dict, dict]:
    """One quickstart run with ``estimator``; returns its result row and its summary."""
    with tempfile.TemporaryDirectory() as run_dir:
        config = load_config(builtin_config("quickstart"), [
            "algorithm.dynamic_sampling=true", *overrides, f"algorithm.advantage={estimator}",
            *([f"steps={steps}"] if steps is not None else []), f"run_dir={run_dir}",
        ])
        resolve_model_path(config.model.path, config.pretrain, progress=False)
        summary = train(config, progress=False)
        records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]

    def mean(key: str) -> float:
        return statistics.fmean(r[key] for r in records)

    return {
        "accuracy_after": summary["eval_after"]["accuracy"],
        "s_per_step": mean("step_s"),
        "dropped_fraction": mean("dropped_fraction"),
        "zero_signal_fraction": mean("zero_signal_fraction"),
        "sampling_rounds": mean("sampling_rounds"),
    }, summary


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="RL steps per run (default: the config's)")
    parser.add_argument("--estimators", default=",".join(ESTIMATORS), help="comma-separated estimator names")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for every run")
    args = parser.parse_args(argv)
    results, before, steps = {}, None, None
    for name in args.estimators.split(","):
        results[name], summary = run(name, args.steps, args.overrides)
        before, steps = summary["eval_before"]["accuracy"], summary["steps"]
    return {"steps": steps, "accuracy_before": before, "results": results}


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
