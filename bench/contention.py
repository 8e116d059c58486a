"""A run on a shared machine: seconds per step idle and beside a busy process; prints one JSON object.

    python bench/contention.py [--steps 5] [--pretrain-steps 3] [key=value ...]

Measures the quickstart job (``bench/quickstart.py``, ``steps`` RL steps, overrides as for
``temper train``) and the default pre-training (``pretrain-steps`` optimizer steps; 0 skips
it), each once with the machine as it is ("idle") and once beside a process spinning on
one core ("busy"), under two settings:

- ``old``: every core (``threads`` = the core count) and OpenMP's default spin-then-sleep waits;
- ``new``: what ``temper`` does now (``threads: 0``, the free cores, and passive waits).

Every measurement runs in a fresh process, since OpenMP reads its wait settings once when
torch loads. The reported ``busy_over_idle`` ratios are the ones to watch (the project's
bar: at most 2.5 for the quickstart with the new setting); a machine already loaded by
other work makes "idle" busy too, so measure on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SETTINGS = ("old", "new")
LOADS = ("idle", "busy")


def setting_env(setting: str) -> dict[str, str]:
    """The environment a measured process starts with under ``setting``."""
    from tempering.threads import PASSIVE_WAITS

    env = {k: v for k, v in os.environ.items() if k not in PASSIVE_WAITS and k != "GOMP_SPINCOUNT"}
    return {**env, **PASSIVE_WAITS} if setting == "new" else env


def setting_threads(setting: str) -> int:
    return 0 if setting == "new" else len(os.sched_getaffinity(0))


def measure(job: str, setting: str, load: str, steps: int, overrides: list[str]) -> dict:
    """One measurement in a fresh process, beside a spinning process when ``load`` is busy."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load == "busy" else None
    try:
        time.sleep(0.5 if spinner else 0)  # the spinner is on a core before the run starts
        command = [sys.executable, __file__, "--child", job, "--threads", str(setting_threads(setting)),
                   "--steps", str(steps), *overrides]
        out = subprocess.run(command, env=setting_env(setting), capture_output=True, text=True, check=False)
    finally:
        if spinner:
            spinner.kill()
            spinner.wait()
    if out.returncode != 0:
        raise SystemExit(f"{job} ({setting}, {load}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def quickstart_child(threads: int, steps: int, overrides: list[str]) -> dict:
    """The quickstart's seconds per step, with a small evaluation (evaluation is not timed)."""
    sys.path.insert(0, str(BENCH))
    import quickstart
    import torch

    result = quickstart.main([f"steps={steps}", f"threads={threads}", "eval.every=0", "eval.problems_per_task=4",
                              "checkpoint.every=0", *overrides])
    return {"s_per_step": result["seconds_per_step"]["total"], "threads_at_end": torch.get_num_threads()}


def pretrain_child(threads: int, steps: int, overrides: list[str]) -> dict:
    """The default pre-training's seconds per optimizer step, into a throwaway folder."""
    import torch

    from tempering.config import builtin_config, load_config
    from tempering.pretrain import pretrain

    config = load_config(builtin_config("quickstart"), [*overrides, f"pretrain.steps={steps}"]).pretrain
    with tempfile.TemporaryDirectory() as out_dir:
        stats = pretrain(config, Path(out_dir), progress=False, threads=threads)
    return {"s_per_step": stats["wall_s"] / steps, "threads_at_end": torch.get_num_threads()}


CHILDREN = {"quickstart": quickstart_child, "pretrain": pretrain_child}


def compare(job: str, steps: int, overrides: list[str]) -> dict:
    """Both settings, idle and busy, with the busy/idle ratio of each setting."""
    result = {}
    for setting in SETTINGS:
        runs = {load: measure(job, setting, load, steps, overrides) for load in LOADS}
        result[setting] = {**runs, "busy_over_idle": runs["busy"]["s_per_step"] / runs["idle"]["s_per_step"]}
    return result


def main(args: argparse.Namespace) -> dict:
    from tempering.config import builtin_config, load_config
    from tempering.policy import resolve_model_path

    config = load_config(builtin_config("quickstart"), args.overrides)
    resolve_model_path(config.model.path, config.pretrain, progress=False)  # cached before anything is timed
    result = {"cores": len(os.sched_getaffinity(0)), "load_before": os.getloadavg(),
              "quickstart": {"steps": args.steps, **compare("quickstart", args.steps, args.overrides)}}
    if args.pretrain_steps:
        result["pretrain"] = {"steps": args.pretrain_steps,
                              **compare("pretrain", args.pretrain_steps, args.overrides)}
    return result


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="quickstart RL steps per measurement")
    parser.add_argument("--pretrain-steps", type=int, default=3, help="pre-training steps per measurement; 0 = skip")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, as for temper train")
    return parser.parse_args(argv)


if __name__ == "__main__":
    parsed = parse_args(sys.argv[1:])
    if parsed.child:
        print(json.dumps(CHILDREN[parsed.child](parsed.threads, parsed.steps, parsed.overrides)))
    else:
        print(json.dumps(main(parsed), indent=2))
