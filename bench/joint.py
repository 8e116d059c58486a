"""Lopsidedness, measured: each domain group trained alone against joint training, static and
adaptive, every domain's held-out accuracy before and after; prints one JSON object.

    python bench/joint.py [--config joint] [--model builtin:generalist] [--steps N] [--joint-steps N]
                          [--seeds 0,1,2] [--arms arithmetic,code,reasoning,static,adaptive] [--out DIR]
                          [key=value ...]
    python bench/joint.py --screen [--out DIR]

Every run starts from the same model (the built-in generalist, pre-trained on first use) and
trains with the same batch, learning rate and seed; only what is drawn differs, and, with
``--joint-steps``, how long the two joint arms train:

- ``arithmetic``, ``code``, ``reasoning``: one domain group alone (the other groups' tasks at
  weight 0, so they are evaluated and never drawn), static weights;
- ``static``: every domain, static weights, no gradient balance;
- ``adaptive``: every domain as the config sets it (``joint``: the learnability mixture with a
  floor, and ``learner.grad_balance_rate``).

``--joint-steps`` sets the joint arms' steps apart from the single-group arms' ``--steps``. At the
same steps a joint run gives each group about a third of the draws a single-group run gives it;
``--joint-steps`` = 3 x ``--steps`` matches the compute of the three single-group runs together
(one joint model against three specialists at the same cost), and each group then sees about
as many of its own problems as its specialist did.

Each arm runs once per seed, the arms of a seed one after the other. A run whose folder already
holds a ``summary.json`` written under the same resolved config (the folder apart) is read back, not run again, so a
bench stopped part-way continues where it stopped with the same ``--out``: the run it stopped in
starts again, and a folder holding a run of another config stops the bench with a message. Per domain and arm the JSON
gives the held-out accuracy after training (mean over seeds, and the half-width of its 95%
t-interval), its change from before, and per group the mean over the group's domains. Under
``checks``: which single-group runs lowered another group by more than the seed spread (the
lopsidedness), how far the adaptive run ends from the best single-group run on each group, and
its margin over the static run. ``--out`` (default: a new folder under runs/) keeps every run's
folder, ``joint.json``, ``joint.md`` (the domains x arms table), ``joint.svg`` (the same as a
heat-map of the change) and ``report.html`` (``temper report`` over the runs).

``--screen`` is how the generalist's reasoning-gym types were chosen: it pre-trains the
generalist's recipe with extra candidate types (:data:`CANDIDATES`) in its corpus, evaluates
each held-out, and reports the types that start between 10% and 70%.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path
from statistics import mean, stdev

import yaml

from tempering import generalist
from tempering.config import ConfigError, TaskSpec, TrainConfig, load_config, validate_config
from tempering.policy import resolve_model_path
from tempering.reporting.html import build_report
from tempering.train import train

ARMS = ("arithmetic", "code", "reasoning", "static", "adaptive")
COMMON = ["checkpoint.every=0"]
"""Overrides of every arm, before the command line's."""
BAND = (0.10, 0.70)
"""Held-out accuracy a domain of the generalist starts within."""
CANDIDATES = {"chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
              "letter_counting": {"min_words": 2, "max_words": 4}, "products": {"min_digits": 1, "max_digits": 2}}
"""Reasoning-gym types the screen tries beside the generalist's own: two with worked solutions
(tempering.tasks.rg_corpus) that started outside the band (7% and 73%), one answer-only."""
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
"""Two-sided 95% t quantiles by degrees of freedom (1.96 past these)."""


def group_of(task: str) -> str:
    if task.startswith("code"):
        return "code"
    return "reasoning" if task.startswith("rg:") else "arithmetic"


def arm_overrides(arm: str, tasks: list[str]) -> list[str]:
    """What an arm changes in the config."""
    if arm == "adaptive":
        return []
    static = ["scheduler.strategy=static", "learner.grad_balance_rate=0"]
    if arm == "static":
        return static
    return [*static, *(f"tasks.{i}.weight=0" for i, task in enumerate(tasks) if group_of(task) != arm)]


def interval(values: list[float]) -> dict[str, float]:
    """``{"mean", "ci95"}``: the mean and the half-width of its 95% t-interval (0 for one value)."""
    if len(values) < 2:
        return {"mean": mean(values), "ci95": 0.0}
    return {"mean": mean(values), "ci95": T95.get(len(values) - 1, 1.96) * stdev(values) / math.sqrt(len(values))}


def saved_config(path: Path) -> dict | None:
    """A run's saved ``config.yaml`` as this version reads it (fields added since with their
    defaults), its folder apart; None when this version refuses it."""
    try:
        return {**validate_config(yaml.safe_load(path.read_text())).model_dump(mode="json"), "run_dir": None}
    except (ConfigError, ValueError):
        return None


def earlier_run(config: TrainConfig, run_dir: Path) -> dict | None:
    """The summary of a run already in ``run_dir`` under this same config (its folder apart: a
    copied run counts), or None where there is none. A run of this config that stopped before its
    summary is removed, to be run again; a run of another config stops the bench."""
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        return None
    if saved_config(saved) != {**config.model_dump(mode="json"), "run_dir": None}:
        raise SystemExit(f"bench: {run_dir} holds a run of another config; give another --out or remove it")
    if (run_dir / "summary.json").is_file():
        print(f"bench: {run_dir} already ran under this config; read back", file=sys.stderr, flush=True)
        return json.loads((run_dir / "summary.json").read_text())
    print(f"bench: {run_dir} stopped before its end; run again", file=sys.stderr, flush=True)
    shutil.rmtree(run_dir)
    return None


def one_run(config_name: str, overrides: list[str], run_dir: Path) -> dict:
    config = load_config(config_name, [*overrides, f"run_dir={run_dir}"])
    summary = earlier_run(config, run_dir)
    if summary is None:
        resolve_model_path(config.model.path, config.pretrain, progress=True)
        summary = train(config, progress=False)
    return {"before": summary["eval_before"]["per_task"], "after": summary["eval_after"]["per_task"],
            "wall_s": summary["wall_s"]}


def summarize(runs: dict[str, list[dict]], tasks: list[str]) -> dict:
    """Per arm: per domain and per group, after and change (mean, 95% half-width) over seeds."""
    groups = sorted({group_of(t) for t in tasks}, key=ARMS.index)
    out = {}
    for arm, seeds in runs.items():
        per_domain = {t: {"after": interval([s["after"][t] for s in seeds]),
                          "change": interval([s["after"][t] - s["before"][t] for s in seeds])} for t in tasks}
        per_group = {g: {"after": interval([mean(s["after"][t] for t in tasks if group_of(t) == g) for s in seeds]),
                         "change": interval([mean(s["after"][t] - s["before"][t] for t in tasks if group_of(t) == g)
                                             for s in seeds])} for g in groups}
        out[arm] = {"domains": per_domain, "groups": per_group,
                    "mean": interval([mean(s["after"].values()) for s in seeds]),
                    "wall_s": mean(s["wall_s"] for s in seeds)}
    return out


def checks(arms: dict, before: dict[str, tuple[float, float]]) -> dict:
    """The acceptance numbers: lopsidedness, adaptive against the best single group, against static."""
    groups = list(before)
    singles = [g for g in groups if g in arms]
    lopsided = []
    for trained in singles:
        for other in groups:
            if other == trained:
                continue
            change, spread = arms[trained]["groups"][other]["change"].values()
            if change < 0 and -change > spread:
                lopsided.append({"trained": trained, "lowered": other, "change": change, "spread": spread})
    result: dict = {"lopsided": lopsided}
    if "adaptive" in arms and singles:
        best = {g: max(arms[s]["groups"][g]["after"]["mean"] for s in singles) for g in groups}
        result["adaptive_below_best_single"] = {g: best[g] - arms["adaptive"]["groups"][g]["after"]["mean"]
                                                for g in groups}
    if "adaptive" in arms and "static" in arms:
        (adaptive, a_spread), (static, s_spread) = arms["adaptive"]["mean"].values(), arms["static"]["mean"].values()
        result["adaptive_over_static"] = {"margin": adaptive - static, "spread": max(a_spread, s_spread)}
    return result


def markdown(arms: dict, before: dict[str, float], tasks: list[str]) -> str:
    """Domains x arms: accuracy after (change), groups first, weakest-before domains on top."""
    names = list(arms)
    lines = ["| domain | before | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]

    def cell(entry: dict) -> str:
        after, change = entry["after"], entry["change"]["mean"]
        return f"{after['mean']:.1%} ±{after['ci95']:.1%} ({change:+.1%})"

    groups = sorted({group_of(t) for t in tasks}, key=ARMS.index)
    group_before = {g: mean(before[t] for t in tasks if group_of(t) == g) for g in groups}
    for g in groups:
        cells = " | ".join(cell(arms[a]["groups"][g]) for a in names)
        lines.append(f"| **{g}** | {group_before[g]:.1%} | {cells} |")
    for t in sorted(tasks, key=lambda t: (ARMS.index(group_of(t)), before[t])):
        lines.append(f"| {t} | {before[t]:.1%} | " + " | ".join(cell(arms[a]["domains"][t]) for a in names) + " |")
    return "\n".join(lines) + "\n"


def heatmap_svg(arms: dict, tasks: list[str]) -> str:
    """Domains (rows) x arms (columns), coloured by the mean change in held-out accuracy: red fell,
    blue rose, white unchanged; each cell says the change in points."""
    names, cell_w, cell_h, left, top = list(arms), 96, 20, 170, 40
    rows = sorted(tasks, key=lambda t: (ARMS.index(group_of(t)), t))
    size = max([abs(arms[a]["domains"][t]["change"]["mean"]) for a in names for t in rows] + [1e-9])
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + cell_w * len(names) + 10}" '
             f'height="{top + cell_h * len(rows) + 10}" font-family="sans-serif" font-size="12">']
    for j, name in enumerate(names):
        parts.append(f'<text x="{left + j * cell_w + cell_w / 2}" y="{top - 10}" text-anchor="middle">{name}</text>')
    for i, task in enumerate(rows):
        y = top + i * cell_h
        parts.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{task}</text>')
        for j, name in enumerate(names):
            change = arms[name]["domains"][task]["change"]["mean"]
            fade = int(255 * (1 - min(abs(change) / size, 1.0)))
            colour = f"rgb({fade},{fade},255)" if change >= 0 else f"rgb(255,{fade},{fade})"
            x = left + j * cell_w
            parts.append(f'<rect x="{x}" y="{y}" width="{cell_w - 2}" height="{cell_h - 2}" fill="{colour}"/>')
            parts.append(f'<text x="{x + cell_w / 2}" y="{y + 14}" text-anchor="middle">{100 * change:+.1f}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def screen(out: Path) -> dict:
    """Pre-train the generalist's recipe with the candidate types added, evaluate every domain."""
    from tempering import api
    from tempering.pretrain import pretrain

    recipe = generalist.recipe()
    extra = [TaskSpec(name=f"rg:{t}", options={"style": "raw", "config": c}) for t, c in CANDIDATES.items()]
    config = recipe.model_copy(update={"tasks": [*recipe.tasks, *extra]})
    start = time.perf_counter()
    stats = pretrain(config, out / "model", progress=True)
    specs = [{"name": t.name, "options": t.options} for t in config.tasks]
    evaluation = api.evaluate(str(out / "model"), tasks=specs, overrides=["eval.problems_per_task=48"])
    per_task = evaluation["per_task"]
    return {"screen": per_task, "pretrain": stats, "wall_s": time.perf_counter() - start, "band": BAND,
            "in_band": sorted(t for t, a in per_task.items() if BAND[0] <= a <= BAND[1]),
            "kept_reasoning": generalist.GROUPS["reasoning"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="joint", help="a config (default: the shipped joint config)")
    parser.add_argument("--model", help="model.path of every run (default: the config's, builtin:generalist)")
    parser.add_argument("--steps", type=int, help="RL steps per run (default: the config's)")
    parser.add_argument("--joint-steps", type=int,
                        help="RL steps of the static and adaptive arms (default: --steps; 3 x --steps matches "
                             "the three single-group runs' compute)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, every arm once each (default 0,1,2)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated arms (default {','.join(ARMS)})")
    parser.add_argument("--out", type=Path, help="folder for the runs and the report (default: a new one under runs/)")
    parser.add_argument("--screen", action="store_true", help="screen reasoning-gym types for the generalist instead")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides of every arm")
    args = parser.parse_args(argv)
    out = args.out or Path("runs") / time.strftime("bench-joint-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    if args.screen:
        result = screen(out)
        (out / "screen.json").write_text(json.dumps(result, indent=2))
        return result
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        parser.error(f"unknown arms {unknown}; known: {', '.join(ARMS)}")
    common = [*COMMON, *args.overrides, *([f"model.path={args.model}"] if args.model else []),
              *([f"steps={args.steps}"] if args.steps is not None else [])]
    tasks = [t.name for t in load_config(args.config, common).tasks]
    joint = [f"steps={args.joint_steps}"] if args.joint_steps is not None else []
    seeds = [int(s) for s in args.seeds.split(",")]
    start, runs = time.perf_counter(), {arm: [] for arm in arms}
    for seed in seeds:
        for arm in arms:
            print(f"joint bench: seed {seed}, arm {arm}", file=sys.stderr, flush=True)
            steps = joint if arm in ("static", "adaptive") else []
            runs[arm].append(one_run(args.config, [*common, *steps, f"seed={seed}", *arm_overrides(arm, tasks)],
                                     out / "runs" / f"{arm}-seed{seed}"))
    first = next(iter(runs.values()))
    before = {t: mean(s["before"][t] for s in first) for t in tasks}
    summary = summarize(runs, tasks)
    group_before = {g: interval([mean(s["before"][t] for t in tasks if group_of(t) == g) for s in first])
                    for g in sorted({group_of(t) for t in tasks}, key=ARMS.index)}
    result = {"config": args.config, "overrides": common, "joint_overrides": joint, "seeds": seeds, "before": before,
              "groups_before": group_before, "arms": summary, "checks": checks(summary, group_before),
              "wall_s": time.perf_counter() - start, "out": str(out)}
    (out / "joint.json").write_text(json.dumps(result, indent=2))
    (out / "joint.md").write_text(markdown(summary, before, tasks))
    (out / "joint.svg").write_text(heatmap_svg(summary, tasks))
    build_report(sorted((out / "runs").iterdir()), out / "report.html")
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
