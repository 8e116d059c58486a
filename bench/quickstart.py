"""Where the time of an RL step goes, on the quickstart job; prints one JSON object.

    python bench/quickstart.py [key=value ...]

Runs ``configs/quickstart.yaml`` (overrides as for ``temper train``) with a held-out
evaluation every ``eval.every`` steps, then reports seconds per step split into
generation, reward and learning, generation and training throughput in tokens/s, and
the held-out greedy accuracy curve. The tiny model's pre-training is not timed here (it
is cached after the first run; ``temper pretrain`` reports its own time).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

from tempering.config import builtin_config, load_config
from tempering.policy import resolve_model_path
from tempering.train import train


def main(overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as run_dir:
        config = load_config(builtin_config("quickstart"), ["eval.every=25", *overrides, f"run_dir={run_dir}"])
        resolve_model_path(config.model.path, config.pretrain, progress=False)
        summary = train(config, progress=False)
        steps = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]

    def mean(key: str) -> float:
        return statistics.fmean(s[key] for s in steps)

    curve = [{"step": 0, "accuracy": summary["eval_before"]["accuracy"]}]
    curve += [{"step": s["step"], "accuracy": s["eval/accuracy"]} for s in steps if "eval/accuracy" in s]
    curve.append({"step": summary["steps"], "accuracy": summary["eval_after"]["accuracy"]})
    return {
        "model": summary["model"],
        "steps": summary["steps"],
        "rollouts_per_step": config.rollout.prompts_per_step * config.rollout.group_size,
        "seconds_per_step": {
            "total": mean("step_s"), "generation": mean("generate_s"),
            "reward": mean("reward_s"), "learning": mean("learn_s"),
        },
        "generation_tokens_per_s": sum(s["completion_tokens"] for s in steps) / sum(s["generate_s"] for s in steps),
        "training_tokens_per_s": sum(s["train_tokens"] for s in steps) / sum(s["learn_s"] for s in steps),
        "accuracy_curve": curve,
        "per_task_before": summary["eval_before"]["per_task"],
        "per_task_after": summary["eval_after"]["per_task"],
        "wall_s": summary["wall_s"],
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=2))
