"""The quickstart with vLLM as the rollout server, next to the built-in sampler; prints one JSON line.

    python bench/vllm_rollouts.py [--steps 20] [key=value ...]

Where vLLM is not installed or torch sees no CUDA device it prints ``{"skipped": why}`` and
exits 0. Otherwise it runs ``--steps`` quickstart steps on the GPU (``model.device=cuda``)
with a vLLM server the run launches (``rollout.server.launch: vllm``: the learner's weights
served with the flags rollouts need, reloaded every step, the server stopped with the run;
its KV cache sized by ``rollout.vllm.kv_cache_gib``), then the same steps with the built-in
sampler, and reports for each: seconds per step (total and generation), generation tokens/s
and the mean ``mismatch/abs_logp`` and ``mismatch/k3``. ``key=value`` overrides apply to
both runs. When the server does not start, it prints ``{"error": ...}`` with the end of
vLLM's log.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from tempering.config import ConfigError, builtin_config, load_config
from tempering.policy import resolve_model_path
from tempering.train import train

LAUNCHED = "rollout.server={url: 'http://127.0.0.1:0', launch: vllm}"


def unavailable() -> str | None:
    """Why this bench cannot run here, or None."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install vllm, on a machine with a CUDA GPU)"
    if not torch.cuda.is_available():
        return f"no CUDA device: torch.cuda.is_available() is false (torch {torch.__version__})"
    return None


def run(overrides: list[str]) -> dict:
    """The quickstart's step timings and mismatch, with these overrides."""
    with tempfile.TemporaryDirectory() as run_dir:
        config = load_config(builtin_config("quickstart"), [*overrides, f"run_dir={run_dir}"])
        train(config, progress=False)
        steps = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]

    def mean(key: str) -> float:
        return statistics.fmean(s[key] for s in steps if key in s)

    return {"s_per_step": mean("step_s"), "generate_s_per_step": mean("generate_s"),
            "generate_tok_s": sum(s["completion_tokens"] for s in steps) / sum(s["generate_s"] for s in steps),
            "mismatch_abs_logp": mean("mismatch/abs_logp"), "mismatch_k3": mean("mismatch/k3")}


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    args, overrides = parser.parse_known_args(argv)
    why = unavailable()
    if why is not None:
        return {"skipped": why}
    common = ["eval.every=0", "eval.problems_per_task=20", "model.device=cuda", *overrides, f"steps={args.steps}"]
    config = load_config(builtin_config("quickstart"), common)
    model_dir = resolve_model_path(config.model.path, config.pretrain, progress=False)
    try:
        served = run([*common, LAUNCHED])
    except ConfigError as exc:  # the launched server did not start: the message quotes its log
        return {"error": str(exc)}
    return {"device": torch.cuda.get_device_name(0), "model": model_dir, "steps": args.steps,
            "vllm": served, "hf": run(common)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
