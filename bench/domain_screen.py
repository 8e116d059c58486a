"""A model's held-out greedy accuracy on every reasoning-gym type (and any other task), to choose
the domains a joint run trains on; prints one JSON object.

    python bench/domain_screen.py [--model builtin:smollm2] [--config smollm2-many] [--types all|easy|a,b] [--easy]
                                  [--tasks add,sub] [--problems 16] [--max-new-tokens 96]
                                  [--max-prompt-chars 2000] [--band 0.05,0.9] [--out FILE] [--threads 1]

Each candidate is one task built as the config would build it: ``rg:<type>`` for each type of
``--types`` (all of reasoning-gym's by default) with the options ``--rg-options`` gives (chat
style, lenient grading: the answer a reader would take; with ``--easy``, the small settings of
:data:`EASY` for the types it lists), and each name of ``--tasks`` with the
options the config gives a task of that name. The model is loaded once (``--config``'s model
and sampler settings, float32 as evaluations run) and each candidate's first ``--problems``
held-out problems are answered greedily, stopping where the config's rollouts stop, then
graded by the task's metric. A type that cannot be built or graded is listed with its error,
not dropped silently, and one whose prompts are longer than ``--max-prompt-chars`` on average
is listed as skipped (its rollouts would cost the most, and a long puzzle is rarely what a
small model starts above zero on).

Per candidate the JSON gives the accuracy, the problems graded, the completions cut off at
``--max-new-tokens``, the seconds the candidate took (generation and grading: what a rollout
of it costs, relative to the others), the prompt's mean length in characters and the first
problem's completion (the start of it), to see why a candidate fails. ``in_band``
lists the candidates whose accuracy lies within ``--band`` (inclusive), best first: where RL
has signal at the start, neither never right nor always right. With ``--out`` every candidate's
result is written as it is measured, and a screen started again with the same ``--out`` and
settings measures only the candidates missing from it. With 16 problems a candidate's accuracy
is a screen, not a measurement (a 95% interval is about +-20 points at 30%).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from report import measured

from tempering.build import build_generator
from tempering.config import ConfigError, TaskSpec, load_config
from tempering.eval.greedy import build_metrics, close_metrics, evaluate
from tempering.policy import load_model

RG_OPTIONS = {"style": "chat", "grading": "lenient"}
EASY = {
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ["+", "-"],
                         "allow_parentheses": False, "allow_negation": False},
    "base_conversion": {"min_base": 2, "max_base": 10, "min_value": 0, "max_value": 20},
    "bitwise_arithmetic": {"difficulty": 1},
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
    "coin_flip": {"min_trials": 3, "max_trials": 5},
    "count_bits": {"min_n": 1, "max_n": 64},
    "count_primes": {"min_n": 1, "max_n": 30},
    "course_schedule": {"min_num_courses": 3, "max_num_courses": 4},
    "decimal_arithmetic": {"min_num_decimal_places": 1, "max_num_decimal_places": 1, "min_terms": 2, "max_terms": 2},
    "decimal_chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                          "min_decimal_places": 1, "max_decimal_places": 1},
    "dice": {"num_dice": 2, "max_dice_size": 6},
    "family_relationships": {"min_family_size": 3, "max_family_size": 4},
    "fraction_simplification": {"min_value": 1, "max_value": 20, "min_factor": 2, "max_factor": 5, "styles": ["plain"]},
    "gcd": {"min_value": 2, "max_value": 30},
    "isomorphic_strings": {"min_string_length": 2, "max_string_length": 4},
    "largest_island": {"min_rows": 3, "max_rows": 4, "min_cols": 3, "max_cols": 4, "max_num_islands": 2,
                       "max_island_size": 3},
    "lcm": {"min_value": 2, "max_value": 12},
    "leg_counting": {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 3},
    "letter_counting": {"min_words": 2, "max_words": 4},
    "letter_jumble": {"min_word_len": 3, "max_word_len": 5, "min_words": 2, "max_words": 3,
                      "max_corruption_level": 0.3},
    "needle_haystack": {"min_num_statements": 3, "max_num_statements": 5},
    "number_filtering": {"min_numbers": 3, "max_numbers": 5, "min_decimals": 0, "max_decimals": 0,
                         "min_value": 0, "max_value": 50},
    "number_sequence": {"min_terms": 4, "max_terms": 5, "min_value": -20, "max_value": 20, "max_complexity": 1},
    "number_sorting": {"min_numbers": 3, "max_numbers": 4, "min_decimals": 0, "max_decimals": 0,
                       "min_value": 0, "max_value": 50},
    "palindrome_generation": {"min_length": 3, "max_length": 5},
    "power_function": {"min_base": -10, "max_base": 10, "min_exponent": 0, "max_exponent": 2},
    "prime_factorization": {"min_value": 2, "max_value": 50},
    "products": {"min_digits": 1, "max_digits": 1},
    "ransom_note": {"max_note_length": 3, "max_magazine_length": 8},
    "rotate_matrix": {"min_n": 2, "max_n": 2, "max_rotations": 2},
    "sentence_reordering": {"min_words_in_sentence": 3, "max_words_in_sentence": 5},
    "simple_equations": {"min_terms": 2, "max_terms": 2, "min_value": 1, "max_value": 10, "operators": ["+", "-"],
                         "operators_weights": [0.5, 0.5]},
    "spell_backward": {"min_word_len": 3, "max_word_len": 5},
    "word_sorting": {"min_words": 3, "max_words": 4, "min_word_length": 3, "max_word_length": 6},
}
"""Small settings of reasoning-gym types (``--easy``): the smallest numbers, lists and words each
type allows that still leave it a task, where a small model's default-settings accuracy is near 0."""


def band(text: str) -> tuple[float, float]:
    low, high = (float(part) for part in text.split(","))
    if not 0 <= low <= high <= 1:
        raise argparse.ArgumentTypeError(f"--band {text}: two accuracies 0 <= low <= high <= 1, e.g. 0.05,0.9")
    return low, high


def json_object(text: str) -> dict:
    try:
        found = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}); e.g. '{json.dumps(RG_OPTIONS)}'") from None
    if not isinstance(found, dict):
        raise argparse.ArgumentTypeError(f"a JSON object of task options, e.g. '{json.dumps(RG_OPTIONS)}'")
    return found


def candidates(config, types: str, tasks: str, rg_options: dict, easy: bool = False) -> list[TaskSpec]:
    """The task of each candidate: the config's own spec for a name it has, else ``rg_options``
    for a reasoning-gym type (with ``easy``, and :data:`EASY` settings for the type, those as
    its ``config``) and no options for any other name. ``types``: ``all``, ``easy`` (the types
    of :data:`EASY`) or names."""
    if types in ("all", "easy"):
        from tempering.tasks.reasoning_gym import rg_types

        names = [f"rg:{name}" for name in rg_types() if types == "all" or name in EASY]
    else:
        names = [f"rg:{name}" for name in types.split(",") if name]
    names += [name for name in tasks.split(",") if name]
    specs = {spec.name: spec for spec in config.tasks}

    def options(name: str) -> dict:
        kind = name.removeprefix("rg:")
        if not name.startswith("rg:"):
            return {}
        return {**rg_options, "config": EASY[kind]} if easy and kind in EASY else rg_options

    return [specs.get(name) or TaskSpec(name=name, options=options(name)) for name in dict.fromkeys(names)]


def prompt_text(problem) -> str:
    return problem.prompt if isinstance(problem.prompt, str) else json.dumps(problem.prompt)


def screen_one(generator, config, spec: TaskSpec, problems: int, max_new_tokens: int, max_prompt_chars: int) -> dict:
    """One candidate's accuracy, counts and seconds; ``{"error": ...}`` where it cannot be built
    or graded, ``{"skipped": ...}`` where its prompts are longer than ``max_prompt_chars``."""
    from tempering.build import build_tasks

    start = time.perf_counter()
    try:
        (task,) = build_tasks(config.model_copy(update={"tasks": [spec]}))
        metrics = build_metrics([task], config.rewards.options)
    except ConfigError as exc:
        return {"error": str(exc)}
    try:
        prompts = task.eval_problems(problems)
        chars = sum(len(prompt_text(p)) for p in prompts) / max(1, len(prompts))
        if chars > max_prompt_chars:
            return {"skipped": f"prompts of {chars:.0f} characters on average, over --max-prompt-chars {max_prompt_chars}",
                    "prompt_chars": round(chars, 1)}
        result = evaluate(generator, [task], problems, max_new_tokens, metrics=metrics, stop=config.rollout.stop)
    except Exception as exc:  # a type whose generator or grader fails is reported, and the screen goes on
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        close_metrics(metrics)
    return {"accuracy": result["per_task"][task.name], "problems": result["problems"][task.name],
            "truncated": result["truncated"].get(task.name, 0), "grader_errors": result["grader_errors"].get(task.name, 0),
            "seconds": round(time.perf_counter() - start, 2),
            "example": result["examples"].get(task.name, {}).get("completion", "")[:300],
            "prompt_chars": round(chars, 1)}


def in_band(found: dict, low: float, high: float) -> list[str]:
    inside = [name for name, r in found.items() if r.get("accuracy") is not None and low <= r["accuracy"] <= high]
    return sorted(inside, key=lambda name: -found[name]["accuracy"])


def table(found: dict) -> str:
    rows = sorted(found.items(), key=lambda item: -(item[1].get("accuracy") or -1))
    lines = [f"{'candidate':32} {'accuracy':>8} {'cut':>4} {'s':>7}"]
    for name, r in rows:
        if "error" in r or "skipped" in r:
            lines.append(f"{name:32} {'error' if 'error' in r else 'skipped'}: {(r.get('error') or r['skipped'])[:80]}")
        else:
            accuracy = "-" if r["accuracy"] is None else f"{100 * r['accuracy']:.1f}%"
            lines.append(f"{name:32} {accuracy:>8} {r['truncated']:>4} {r['seconds']:>7.1f}")
    return "\n".join(lines)


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="default: the config's model.path")
    parser.add_argument("--config", default="smollm2-many", help="sampler settings, stop strings and task options")
    parser.add_argument("--types", default="all", help="reasoning-gym types, comma-separated, all, or easy (those of EASY)")
    parser.add_argument("--easy", action="store_true", help="screen a type of EASY at its small settings")
    parser.add_argument("--rg-options", type=json_object, default=RG_OPTIONS,
                        help=f"options of a reasoning-gym candidate the config does not name, as JSON "
                             f"(default: {json.dumps(RG_OPTIONS)})")
    parser.add_argument("--tasks", default="", help="other candidates, comma-separated (add, code:below, ...)")
    parser.add_argument("--problems", type=int, default=16, help="held-out problems per candidate")
    parser.add_argument("--max-new-tokens", type=int, help="default: the config's eval.max_new_tokens")
    parser.add_argument("--max-prompt-chars", type=int, default=2000,
                        help="skip a candidate whose prompts are longer on average (their rollouts cost the most)")
    parser.add_argument("--band", type=band, default=(0.05, 0.9), help="the accuracies in_band keeps, low,high")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", help="JSON file written as the screen goes, and read back to continue it")
    args = parser.parse_args(argv)
    if args.problems < 1:
        parser.error("--problems: at least 1")
    torch.set_num_threads(args.threads)
    try:
        config = load_config(args.config)
        specs = candidates(config, args.types, args.tasks, args.rg_options, args.easy)
    except (ConfigError, ValueError) as exc:
        parser.error(str(exc))
    max_new_tokens = args.max_new_tokens or config.eval.max_new_tokens
    settings = {"model": args.model or config.model.path, "config": args.config, "problems": args.problems,
                "max_new_tokens": max_new_tokens, "max_prompt_chars": args.max_prompt_chars, "stop": list(config.rollout.stop), "rg_options": args.rg_options, "easy": args.easy}
    out = Path(args.out) if args.out else None
    found: dict = {}
    if out and out.exists():
        kept = json.loads(out.read_text())
        if kept.get("settings") != settings:
            parser.error(f"--out {out} holds a screen with other settings: {kept.get('settings')}")
        found = kept["candidates"]
    model, tokenizer, resolved = load_model(config, settings["model"], progress=False)
    generator = build_generator(config, model, tokenizer, config.eval.batch_size)
    for i, spec in enumerate(specs):
        if spec.name in found:
            continue
        found[spec.name] = screen_one(generator, config, spec, args.problems, max_new_tokens, args.max_prompt_chars)
        r = found[spec.name]
        print(f"domain_screen {i + 1}/{len(specs)} {spec.name}: "
              f"{r.get('error') or r.get('skipped') or r['accuracy']} ({r.get('seconds', 0):.0f} s)", file=sys.stderr, flush=True)
        if out:
            out.write_text(json.dumps({"settings": settings, "candidates": found}, indent=1))
    print(table(found), file=sys.stderr)
    return {"settings": {**settings, "model": resolved, "threads": args.threads}, "candidates": found,
            "band": list(args.band), "in_band": in_band(found, *args.band), "measured": measured("domain_screen", argv)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=1))
