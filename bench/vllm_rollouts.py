"""The quickstart with vLLM as the rollout server, next to the built-in sampler; prints one JSON line.

    python bench/vllm_rollouts.py [--steps 20] [--port 8011] [--gpu-memory-utilization 0.3] [key=value ...]

Where vLLM is not installed or torch sees no CUDA device it prints ``{"skipped": why}`` and
exits 0. Otherwise it serves the quickstart's model (the built-in tiny one, pre-trained
first when not cached) with ``vllm serve`` on 127.0.0.1 (``--logprobs-mode
processed_logprobs``, so its log-probs are the temperature-scaled ones the learner
recomputes; ``VLLM_SERVER_DEV_MODE=1`` for the weight reload), runs ``--steps`` quickstart
steps with ``rollout.server`` pointing at it (``reload: vllm``: weights reloaded every
step), then the same steps with the built-in sampler, both on the GPU (``model.device=cuda``),
and reports for each: seconds per step (total and generation), generation tokens/s and
the mean ``mismatch/abs_logp`` and ``mismatch/k3``. ``key=value`` overrides apply to both runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

from tempering.config import builtin_config, load_config
from tempering.models.loading import resolve_model_path
from tempering.train import train


def unavailable() -> str | None:
    """Why this bench cannot run here, or None."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install vllm, on a machine with a CUDA GPU)"
    if not torch.cuda.is_available():
        return f"no CUDA device: torch.cuda.is_available() is false (torch {torch.__version__})"
    return None


def wait_for(url: str, process: subprocess.Popen, timeout_s: float) -> None:
    """Until ``url`` answers, or a RuntimeError when the server exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vllm serve exited with status {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5):
                return
        except OSError:
            time.sleep(2)
    raise RuntimeError(f"vllm serve did not answer within {timeout_s:.0f} s")


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
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--start-timeout", type=float, default=600.0, help="seconds vLLM may take to start")
    args, overrides = parser.parse_known_args(argv)
    why = unavailable()
    if why is not None:
        return {"skipped": why}
    common = ["eval.every=0", "eval.problems_per_task=20", "model.device=cuda", *overrides, f"steps={args.steps}"]
    config = load_config(builtin_config("quickstart"), common)
    model_dir = resolve_model_path(config.model.path, config.pretrain, progress=False)
    url = f"http://127.0.0.1:{args.port}"
    server = subprocess.Popen(
        ["vllm", "serve", model_dir, "--host", "127.0.0.1", "--port", str(args.port), "--dtype", "float32",
         "--logprobs-mode", "processed_logprobs", "--enforce-eager", "--seed", "0",
         "--gpu-memory-utilization", str(args.gpu_memory_utilization)],
        env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(url, server, args.start_timeout)
        served = run([*common, f"rollout.server={{url: '{url}', reload: vllm}}"])
    except RuntimeError as exc:
        server.terminate()
        return {"error": str(exc), "vllm_stderr_tail": server.stderr.read()[-4000:]}
    finally:
        server.terminate()
        server.wait(timeout=60)
    return {"device": torch.cuda.get_device_name(0), "model": model_dir, "steps": args.steps,
            "vllm": served, "hf": run(common)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
