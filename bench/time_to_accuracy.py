"""Time to accuracy: tempering against TRL's GRPOTrainer, held-out accuracy against training time; prints one JSON object.

    python bench/time_to_accuracy.py [--runs tiny,smollm2] [--seeds 0,1,2] [--steps N] [--every K]
        [--targets 0.7,0.9,0.95] [--budget-s S] [--model PATH] [--bf16] [--out DIR] [--save DIR] [--quick]

A run is one of ``bench/vs_trl.py``'s set-ups, trained by both sides with its machinery:
``tiny`` is the ``add`` task on the built-in tiny model, ``smollm2`` chat ``add`` on
SmolLM2-135M-Instruct graded by the last number. Both sides start from the same weights and
train on the same problems in the same order with the same prompts per step, group size,
completion length, learning rate, seed and the rest of vs_trl's matched settings, one thread
each, TRL first. Each is evaluated greedily by tempering's own ``evaluate`` on the same
held-out problems before training, every ``--every`` steps and after its last step.

The clock: a side's training time at an evaluation is the sum of its steps so far, each from
its start to its end (tempering's ``step_s``: sampling, rewards, learning, publishing the
weights; TRL: the Trainer's ``on_step_begin`` to ``on_step_end``: generation, reward, loss,
backward, optimizer), so evaluations, per-step logging and set-up count on neither side; the
seconds an evaluation took are reported apart (``eval_s``, the mean per evaluation). A target
is reached at the first evaluation at or above it, so times have a resolution of ``--every``
steps on both sides.

Per run and seed, each side's curve (step, accuracy, ``train_s``), the training time to each
target (null where the run never reached it; ``best_accuracy`` says how far it got), and the
accuracy at the last evaluation within ``--budget-s`` seconds of training (``short_of_budget``:
the run's whole training took less). Over seeds: the median with min and max (a seed that never
reached a target counts as slower than every one that did). ``ratios``: TRL's median time over
tempering's per target, the convention ``bench/report.py`` reads (``at_least``: TRL reached
the target in no seed, and the ratio is its shortest whole training over tempering's median).
``--out DIR`` writes ``time_to_accuracy.md`` (the tables) and ``time_to_accuracy-<run>.svg``
(accuracy against training seconds, both sides and every seed on one chart); ``--save DIR``
writes the JSON for ``bench/report.py``. ``--quick``: 2 steps, an evaluation after each, 8
held-out problems, the first seed only.

Not done: a code task graded in the sandbox (TRL rewarded through the same sandbox) is not a
run here yet. What cannot be matched is listed under ``"unmatched"``. Needs ``pip install -e
'.[bench]'`` (TRL and datasets).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from distill import curve
from report import measured, save
from tempering.reporting.svg import Line, accuracy_chart
from vs_trl import (MODELS, SHARED, UNMATCHED, _accuracy, seed_list, tempering_overrides, train_tempering, train_trl,
                    trl_version)

RUNS = {
    "tiny": {**MODELS["tiny"], "every": 2, "targets": "0.7,0.9,0.95", "budget_s": 2.0, "seeds": "0,1,2"},
    "smollm2": {**MODELS["smollm2"], "steps": 10, "every": 2, "targets": "0.05,0.1,0.2", "budget_s": 600.0},
}
CLOCK_UNMATCHED = [
    "clock: TRL's step is timed from on_step_begin to on_step_end (its data loading and per-step logging "
    "left out); tempering's is step_s (its monitors, logging and sample file left out)",
]


def tempering_side(spec: dict, steps: int, every: int, bf16: bool, seed: int) -> dict:
    """tempering's run with an evaluation every ``every`` steps: its curve and seconds per evaluation."""
    summary, records = train_tempering(tempering_overrides(spec, steps, bf16, seed) + [f"eval.every={every}"])
    points = [{key: point[key] for key in ("step", "accuracy", "train_s")} for point in curve(records, summary)]
    timed = [r["eval_s"] for r in records if "eval_s" in r]
    return {"curve": points, "eval_s": statistics.fmean(timed) if timed else None}


def trl_side(spec: dict, steps: int, every: int, bf16: bool, seed: int) -> dict:
    """TRL's run with the same evaluations, made from a callback outside its step clock."""
    from transformers import TrainerCallback

    clock = {"train_s": 0.0, "begin": 0.0}
    points: list[dict] = []
    eval_times: list[float] = []

    def evaluate_now(model, tokenizer, step: int) -> None:
        start = time.perf_counter()
        model.eval()
        accuracy = _accuracy(model, tokenizer, spec, seed, spec["eval_problems"], spec["max_completion"])
        model.train()
        eval_times.append(time.perf_counter() - start)
        points.append({"step": step, "accuracy": accuracy, "train_s": clock["train_s"]})

    class EvalClock(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
            evaluate_now(model, processing_class, 0)

        def on_step_begin(self, args, state, control, **kwargs):
            clock["begin"] = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
            clock["train_s"] += time.perf_counter() - clock["begin"]
            if state.global_step % every == 0 or state.global_step == steps:
                evaluate_now(model, processing_class, state.global_step)

    train_trl(spec, steps, bf16, seed, [EvalClock()])
    return {"curve": points, "eval_s": statistics.fmean(eval_times[1:]) if len(eval_times) > 1 else None}


def time_to(points: list[dict], target: float) -> float | None:
    """Training seconds at the first evaluation at or above ``target``; None when none was.

    >>> time_to([{"accuracy": 0.5, "train_s": 0.0}, {"accuracy": 0.8, "train_s": 2.0}], 0.7)
    2.0
    >>> time_to([{"accuracy": 0.5, "train_s": 0.0}], 0.7) is None
    True
    """
    return next((p["train_s"] for p in points if p["accuracy"] >= target), None)


def within(points: list[dict], budget_s: float) -> float:
    """Accuracy at the last evaluation within ``budget_s`` seconds of training.

    >>> within([{"accuracy": 0.5, "train_s": 0.0}, {"accuracy": 0.8, "train_s": 2.0}], 1.5)
    0.5
    """
    return [p for p in points if p["train_s"] <= budget_s][-1]["accuracy"]


def spread(values: list[float | None]) -> dict:
    """Median, min and max over seeds, None (not reached) counting as slower than any time;
    a median or max that falls on such a seed is None.

    >>> spread([3.0, None, 1.0])
    {'median': 3.0, 'min': 1.0, 'max': None, 'reached': 2, 'seeds': 3}
    """
    ordered = sorted(math.inf if v is None else v for v in values)

    def finite(x: float) -> float | None:
        return None if math.isinf(x) else x

    return {"median": finite(statistics.median(ordered)), "min": finite(ordered[0]), "max": finite(ordered[-1]),
            "reached": sum(v is not None for v in values), "seeds": len(values)}


def side_summary(side: dict, targets: list[float], budget_s: float) -> dict:
    """One seed's numbers of one side, from its curve."""
    points = side["curve"]
    return {**side, "to_target": {str(t): time_to(points, t) for t in targets},
            "best_accuracy": max(p["accuracy"] for p in points), "final_accuracy": points[-1]["accuracy"],
            "train_s": points[-1]["train_s"], "s_per_step": points[-1]["train_s"] / max(points[-1]["step"], 1),
            "within_budget": within(points, budget_s), "short_of_budget": points[-1]["train_s"] < budget_s}


def over_seeds(per_seed: list[dict], side: str, targets: list[float]) -> dict:
    runs = [run[side] for run in per_seed]
    return {"to_target": {str(t): spread([r["to_target"][str(t)] for r in runs]) for t in targets},
            "within_budget": spread([r["within_budget"] for r in runs]),
            "final_accuracy": spread([r["final_accuracy"] for r in runs]),
            "s_per_step": spread([r["s_per_step"] for r in runs]),
            "eval_s": statistics.fmean(r["eval_s"] for r in runs) if all(r["eval_s"] for r in runs) else None}


def ratios(name: str, result: dict) -> list[dict]:
    """TRL's median time to each target over tempering's, for ``bench/report.py``."""
    found = []
    for target, ours in result["tempering"]["to_target"].items():
        theirs = result["trl"]["to_target"][target]
        if not ours["median"]:
            continue  # tempering not there (or there before training): no ratio to state
        seeds = f"{ours['seeds']} seeds, median" if ours["seeds"] > 1 else "1 seed"
        what = f"time to {float(target):.0%} held-out accuracy, {name} ({seeds}, one thread)"
        if theirs["median"]:
            found.append({"what": what, "ratio": theirs["median"] / ours["median"], "peer": "TRL"})
        elif theirs["reached"] == 0:
            shortest = min(run["trl"]["train_s"] for run in result["per_seed"])
            found.append({"what": what, "ratio": shortest / ours["median"], "at_least": True, "peer": "TRL"})
    return found


def one_run(name: str, spec: dict, seeds: list[int], bf16: bool) -> dict:
    targets = [float(t) for t in spec["targets"].split(",")]
    per_seed = []
    for seed in seeds:
        runs = {"trl": trl_side(spec, spec["steps"], spec["every"], bf16, seed),
                "tempering": tempering_side(spec, spec["steps"], spec["every"], bf16, seed)}
        per_seed.append({"seed": seed, **{side: side_summary(run, targets, spec["budget_s"])
                                         for side, run in runs.items()}})
    result = {
        "steps": spec["steps"], "every": spec["every"], "targets": targets, "budget_s": spec["budget_s"],
        "seeds": seeds, "model": spec["path"], "eval_problems": spec["eval_problems"],
        "max_completion_length": spec["max_completion"], "learning_rate": spec["lr"], "reward": spec["reward"],
        "accuracy_before": per_seed[0]["tempering"]["curve"][0]["accuracy"], "per_seed": per_seed,
        "tempering": over_seeds(per_seed, "tempering", targets), "trl": over_seeds(per_seed, "trl", targets),
    }
    result["ratios"] = ratios(name, result)
    return result


def seconds(entry: dict, best: list[float]) -> str:
    """A median time with its min-max, or how many seeds never got there and how far they got.

    >>> seconds({"median": 1.25, "min": 1.0, "max": 2.0, "reached": 3, "seeds": 3}, [0.9, 0.95, 0.97])
    '1.2 s (1.0-2.0)'
    >>> seconds({"median": None, "min": 1.0, "max": None, "reached": 1, "seeds": 3}, [0.9, 0.85, 0.97])
    'not reached in 2 of 3 seeds (best 85%-97%; 1.0 s in the one that did)'
    """
    if entry["median"] is None:
        missed = entry["seeds"] - entry["reached"]
        done = f"; {entry['min']:.1f} s in the one that did" if entry["reached"] == 1 else (
            f"; {entry['min']:.1f} s at the fastest" if entry["reached"] else "")
        return f"not reached in {missed} of {entry['seeds']} seeds (best {min(best):.0%}-{max(best):.0%}{done})"
    high = "not reached" if entry["max"] is None else f"{entry['max']:.1f}"
    return f"{entry['median']:.1f} s ({entry['min']:.1f}-{high})"


def markdown(name: str, result: dict, version: str) -> str:
    """The run's table: time to each target, accuracy within the budget and after, s/step."""
    seeds = len(result["seeds"])
    best = {side: [run[side]["best_accuracy"] for run in result["per_seed"]] for side in ("tempering", "trl")}
    ratio = {row["what"].split(",")[0]: row for row in result["ratios"]}
    lines = [f"**{name}** ({result['model']}, {result['steps']} steps, evaluated every {result['every']} on "
             f"{result['eval_problems']} held-out problems, {result['accuracy_before']:.1%} before; "
             f"{seeds} seed{'s' if seeds > 1 else ''}: median (min-max))", "",
             f"| training time to | tempering | TRL {version} | TRL / tempering |", "| --- | --- | --- | --- |"]
    for target in result["tempering"]["to_target"]:
        key = f"time to {float(target):.0%} held-out accuracy"
        row = ratio.get(key)
        shown = "" if row is None else f"{'at least ' if row.get('at_least') else ''}{row['ratio']:.1f}x"
        lines.append(f"| {float(target):.0%} | {seconds(result['tempering']['to_target'][target], best['tempering'])} "
                     f"| {seconds(result['trl']['to_target'][target], best['trl'])} | {shown} |")

    def accuracy(side: str, key: str) -> str:
        entry = result[side][key]
        return f"{entry['median']:.1%} ({entry['min']:.1%}-{entry['max']:.1%})"

    def per_step(side: str) -> str:
        entry = result[side]["s_per_step"]
        return f"{entry['median']:.3f} ({entry['min']:.3f}-{entry['max']:.3f})"

    def eval_s(side: str) -> str:
        value = result[side]["eval_s"]
        return "" if value is None else f"{value:.1f}"

    lines += [f"| accuracy within {result['budget_s']:g} s of training | {accuracy('tempering', 'within_budget')} "
              f"| {accuracy('trl', 'within_budget')} | |",
              f"| accuracy after {result['steps']} steps | {accuracy('tempering', 'final_accuracy')} "
              f"| {accuracy('trl', 'final_accuracy')} | |",
              f"| training seconds per step | {per_step('tempering')} | {per_step('trl')} | |",
              f"| seconds per evaluation (not counted) | {eval_s('tempering')} | {eval_s('trl')} | |"]
    return "\n".join(lines) + "\n"


COLOURS = {"tempering": "#1f77b4", "trl": "#d62728"}


def tick_step(longest: float) -> float:
    """A round step (1, 2 or 5 times a power of ten) that cuts ``longest`` into at most 5 parts.

    >>> tick_step(15.8), tick_step(3.0), tick_step(0.4)
    (5, 1.0, 0.1)
    """
    magnitude = 10 ** math.floor(math.log10(longest / 5))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude * 5 >= longest)


def chart_svg(name: str, result: dict, version: str) -> str:
    """Held-out accuracy against training seconds: a line per side and seed, dashed targets."""
    longest = max(p["train_s"] for run in result["per_seed"] for side in COLOURS for p in run[side]["curve"]) or 1.0
    step = tick_step(longest)
    x_max = step * math.ceil(longest / step)
    lines = [Line([(p["train_s"], p["accuracy"]) for p in run[side]["curve"]], colour, f"{side}, seed {run['seed']}",
                  width=1.5, opacity=0.8) for run in result["per_seed"] for side, colour in COLOURS.items()]
    legend = [("tempering" if side == "tempering" else f"TRL {version}", colour) for side, colour in COLOURS.items()]
    return accuracy_chart(f"{name}: held-out accuracy against training time", across=lambda seconds: seconds / x_max,
                          ticks=[(tick * step, f"{tick * step:g}") for tick in range(round(x_max / step) + 1)],
                          x_label="training seconds (evaluations excluded)", lines=lines, legend=legend,
                          notes=["a line per seed;", "dashed: targets"], rules=result["targets"], width=640,
                          height=360, right=150)


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="tiny", help="comma-separated: " + ", ".join(RUNS))
    parser.add_argument("--seeds", type=seed_list, help="comma-separated integers (default: the run's, tiny 0,1,2)")
    parser.add_argument("--steps", type=int, help="RL steps per side (default: the run's, tiny 20)")
    parser.add_argument("--every", type=int, help="evaluate every this many steps (default: the run's, tiny 2)")
    parser.add_argument("--targets", help="comma-separated held-out accuracies (default: the run's, tiny 0.7,0.9,0.95)")
    parser.add_argument("--budget-s", type=float, help="training seconds for 'accuracy within' (default: the run's)")
    parser.add_argument("--model", help="a model path for every run instead of the run's (as model.path takes it)")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast on both sides (TRL's default)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 steps, evaluated after each, "
                        "8 held-out problems, the first seed")
    parser.add_argument("--out", type=Path, help="folder for time_to_accuracy.md and time_to_accuracy-<run>.svg")
    parser.add_argument("--save", type=Path, help="folder to save the JSON in for bench/report.py")
    options = parser.parse_args(argv)
    unknown = [name for name in options.runs.split(",") if name not in RUNS]
    if unknown:
        parser.error(f"--runs: unknown {', '.join(unknown)}; known: {', '.join(RUNS)}")
    version = trl_version()
    torch.set_num_threads(1)
    result: dict = {"trl_version": version, "threads": 1, "precision": "bf16 autocast" if options.bf16 else "fp32",
                    "settings": {**SHARED, "betas": list(SHARED["betas"])}, "unmatched": UNMATCHED + CLOCK_UNMATCHED,
                    "runs": {}, "ratios": [], "measured": measured("time_to_accuracy", argv)}
    for name in options.runs.split(","):
        spec = {**RUNS[name], **{key: value for key, value in (
            ("steps", options.steps), ("every", options.every), ("targets", options.targets),
            ("budget_s", options.budget_s), ("path", options.model), ("seeds", options.seeds)) if value is not None}}
        seeds = spec["seeds"] if options.seeds else seed_list(spec["seeds"])
        if options.quick:
            spec.update(steps=2, every=1, eval_problems=8)
            seeds = seeds[:1]
        run = one_run(name, spec, seeds, options.bf16)
        result["runs"][name] = run
        result["ratios"] += run["ratios"]
    if options.out:
        result["out"] = str(options.out)
        options.out.mkdir(parents=True, exist_ok=True)
        (options.out / "time_to_accuracy.md").write_text("\n".join(
            markdown(name, run, version) for name, run in result["runs"].items()))
        for name, run in result["runs"].items():
            (options.out / f"time_to_accuracy-{name}.svg").write_text(chart_svg(name, run, version))
    if options.save:
        save(result, options.save, "-".join(result["runs"]))
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=2))
