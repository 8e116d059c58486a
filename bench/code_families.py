"""A model's held-out greedy pass@1 per family of the ``code`` task, to choose what to train on.

    python bench/code_families.py [--model builtin:smollm2] [--config smollm2-code] [--problems 8]
                                  [--levels 1] [--max-new-tokens N] [--no-stop] [--families a,b]

Each family's held-out problems (``CodeTask(families=[name]).eval_problems``, chat style) are
answered greedily in one batch and graded by the ``code`` reward in the sandbox with the
config's options (``smollm2-code``: leniently, ``unfenced``); answers stop where the config's
rollouts stop (``rollout.stop``: the closing fence) unless ``--no-stop``, and run to
``eval.max_new_tokens`` unless ``--max-new-tokens``. A sandbox fault stops the bench rather
than counting as a failed program. Prints one JSON object (family -> kind, problems, passed) and a table
sorted by pass rate. A family with few held-out constants repeats them across its problems, so
a handful of problems per family is a coarse screen, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from tempering.build import build_generator
from tempering.config import ConfigError, load_config
from tempering.policy import load_model
from tempering.rewards.base import build_reward
from tempering.rollout.base import SamplingParams
from tempering.tasks.code import CodeTask
from tempering.tasks.code_families import FAMILIES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2")
    parser.add_argument("--config", default="smollm2-code", help="grading, stop strings and lengths from this config")
    parser.add_argument("--problems", type=int, default=8, help="held-out problems per family")
    parser.add_argument("--levels", default="1", help="levels drawn from, e.g. 1,2")
    parser.add_argument("--max-new-tokens", type=int, help="default: the config's eval.max_new_tokens")
    parser.add_argument("--no-stop", action="store_true", help="let answers run past the config's rollout.stop")
    parser.add_argument("--families", help="only these families (default: all)")
    args = parser.parse_args()
    names = args.families.split(",") if args.families else [f.name for f in FAMILIES]
    try:
        config = load_config(args.config)
        levels = [int(level) for level in args.levels.split(",")]
        problems = [p for name in names for p in
                    CodeTask("code", 0, families=[name], levels=levels, style="chat").eval_problems(args.problems)]
    except (ConfigError, ValueError) as exc:
        parser.error(str(exc))

    model, tokenizer, _ = load_model(config, args.model, progress=False)
    generator = build_generator(config, model, tokenizer, config.eval.batch_size)  # float32, as evaluations run
    params = SamplingParams(greedy=True, max_new_tokens=args.max_new_tokens or config.eval.max_new_tokens,
                            stop=() if args.no_stop else tuple(config.rollout.stop))
    start = time.perf_counter()
    groups = generator.generate(problems, group_size=1, params=params)
    generate_s = time.perf_counter() - start
    reward = build_reward("code", config.rewards.options.get("code"))
    try:
        results = reward.score_batch([g.problem for g in groups], [g.rollouts[0] for g in groups])
    finally:
        reward.close()
    if errors := [r.error for r in results if r.error]:
        raise SystemExit(f"the sandbox failed on {len(errors)} programs: {errors[0]}")

    found: dict[str, dict] = {}
    for group, result in zip(groups, results):
        meta = group.problem.meta
        entry = found.setdefault(meta["family"], {"kind": meta["kind"], "problems": 0, "passed": 0})
        entry["problems"] += 1
        entry["passed"] += int(result.score == 1.0)
    print(json.dumps({"model": args.model, "levels": levels, "generate_s": round(generate_s), "families": found}, indent=2))
    for name, entry in sorted(found.items(), key=lambda item: item[1]["passed"] / item[1]["problems"]):
        share = entry["passed"] / entry["problems"]
        print(f"{entry['kind']:<10} {name:<16} {entry['passed']:>3}/{entry['problems']:<3} {100 * share:5.1f}%", file=sys.stderr)


if __name__ == "__main__":
    main()
