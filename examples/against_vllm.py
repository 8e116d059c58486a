"""Train with rollouts sampled by a vLLM server (on a CUDA machine with vLLM installed).

Starts ``vllm serve`` on 127.0.0.1 with the policy's model, trains with ``rollout.server``
pointing at it, and stops it. Two vLLM settings matter: ``--logprobs-mode
processed_logprobs`` (the log-probs of the temperature-scaled distribution, the ones the
learner recomputes) and ``VLLM_SERVER_DEV_MODE=1`` (the endpoint that reloads the weights
the learner writes after every step: ``reload: vllm``). Each step's ``mismatch/abs_logp``
says how far vLLM's log-probs are from the learner's.

    python examples/against_vllm.py [--model PATH] [--port 8012] [key=value ...]

Where vLLM or a CUDA device is missing it says so and exits 0. Against a server already
running elsewhere, set ``rollout.server.url`` in a config instead (``weights_dir`` on
storage both machines see).
"""

import argparse
import importlib.util
import os
import subprocess
import sys
import time
import urllib.request

from tempering import train


def unavailable():
    """Why this example cannot run here, or None."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install vllm, on a machine with a CUDA GPU)"
    import torch

    return None if torch.cuda.is_available() else "torch sees no CUDA device"


def serve(model: str, port: int) -> subprocess.Popen:
    command = ["vllm", "serve", model, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
               "--logprobs-mode", "processed_logprobs", "--enforce-eager", "--gpu-memory-utilization", "0.3"]
    server = subprocess.Popen(command, env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"})
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"vllm serve exited with status {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5):
                return server
        except OSError:
            time.sleep(2)
    server.terminate()
    raise SystemExit("vllm serve did not answer within 600 s")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model folder or hub id vLLM loads; default: builtin:tiny")
    parser.add_argument("--port", type=int, default=8012)
    args, overrides = parser.parse_known_args(argv)
    why = unavailable()
    if why is not None:
        print(f"skipped: {why}")
        return
    model = args.model
    if model is None:  # the built-in tiny model's folder (pre-trained on first use, then cached)
        from tempering.build import resolve_model_path
        from tempering.config import PretrainConfig

        model = resolve_model_path("builtin:tiny", PretrainConfig())
    server = serve(model, args.port)
    try:
        summary = train({"steps": 10, "model": {"path": model, "device": "cuda"},
                         "rollout": {"server": {"url": f"http://127.0.0.1:{args.port}", "reload": "vllm"}}},
                        overrides, progress=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    print(f"held-out accuracy {summary['eval_before']['accuracy']} -> {summary['eval_after']['accuracy']}")


if __name__ == "__main__":
    main(sys.argv[1:])
