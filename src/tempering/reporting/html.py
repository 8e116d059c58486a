"""``temper report``: one self-contained HTML file about one or more runs.

The page reads only what a run folder holds (``metrics.jsonl``, ``samples.jsonl``,
``config.yaml``, ``summary.json``) and needs no network: its script and style are inlined
from ``report.js`` and ``report.css`` beside this file, and plots are SVG drawn by that
script. A plot appears only for metrics some run has; several runs share each plot, one
colour per run. Python decides what goes where (which keys form which plot, which axis each
series is read on, which rollouts the browser shows); the script only draws, smooths (an
exponential moving average, as TensorBoard's slider does, the raw points kept faint) and
puts the axis ticks at round numbers.

Quantities of different scale never share an axis: a plot's series are grouped by their
largest magnitude (a group spans at most :data:`SCALE_GAP` times), the first group read on the
left axis, the second on the right, further ones in further plots of the same title. So
``ratio_mean`` (about 1) and ``mismatch/abs_logp`` (about 1e-7) are each visible.

Per-domain metrics of many domains, and shares, are heat-maps instead (``domains.py`` says
when and how their rows are ordered), beside held-out accuracy per task first and last.
Held-out accuracy at several lengths is plotted against length, one line per evaluation,
after the accuracy plots (``lengths.py``).

Not done: live updating, zooming, and any statistic the run did not log.
"""

from __future__ import annotations

import json
import math
import random
import re
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

import yaml

from tempering.config import ConfigError
from tempering.reporting.domains import family_rank, family_title, heatmaps, heldout, heldout_across, split_key
from tempering.reporting.lengths import NOT_LENGTH, depth_heatmaps, length_panels, length_svgs
from tempering.reporting.metrics import read_jsonl

PANELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Reward", "mean reward of the step's rollouts, overall and per domain", (r"reward", r"domain/.+/reward")),
    ("Accuracy", "the task metric: training samples per domain, and held-out (eval/)",
     (r"accuracy", r"domain/.+/success", r"eval/accuracy", r"eval/(?!grader_errors$|truncated$)" + NOT_LENGTH + ".+")),
    ("Reward parts", "each reward and component, mean over rollouts", (r"reward/(?!dropped$|errors$).+",)),
    ("Mixture weights", "each task's share of the next draws", (r"domain/.+/weight",)),
    ("Curriculum level", "tasks with levels", (r"domain/.+/level",)),
    ("Completion length", "mean completion tokens per rollout", (r"completion_length",)),
    ("Truncation", "share cut off at the length limit, and the overlong penalty", (r"truncated_fraction",
                                                                                  r"overlong_penalty")),
    ("KL", "to the reference policy, per token", (r"kl",)),
    ("Entropy", "of the policy on its samples, per token", (r"entropy",)),
    ("Clip fraction", "tokens whose ratio was clipped", (r"clip_fraction", r"dual_clip_fraction")),
    ("Loss and gradient norm", "", (r"loss", r"value_loss", r"grad_norm")),
    ("Dropped groups", "groups with no signal dropped by dynamic sampling, capped by token share, "
     "and per task (cumulative)", (r"dropped_groups", r"capped_groups", r"domain/.+/dropped_groups")),
    ("Groups without signal", "share of sampled groups whose rewards were all equal",
     (r"zero_signal_fraction", r"dropped_fraction")),
    ("Stale rollouts", "policy versions behind the learner, and rollouts dropped as too stale (cumulative)",
     (r"staleness", r"dropped_stale")),
    ("Sandbox statuses", "share of scored rollouts per status; rollouts dropped for a grader fault",
     (r"diag/.+/status/.+", r"reward/dropped", r"reward/errors")),
    ("Monitors", "reward-hacking monitor values (alerts are listed below)", (r"monitor/(?!.*/alert$).+",)),
    ("Throughput", "tokens per second", (r"generate_tok_s", r"train_tok_s")),
    ("Time split", "seconds per step", (r"step_s", r"generate_s", r"reward_s", r"learn_s", r"weight_sync_s",
                                        r"wait_s", r"checkpoint_s")),
    ("Sampler/learner mismatch", "how far the learner's log-probs are from the sampler's",
     (r".*mismatch.*", r"behaviour_weight", r"ratio_mean")),
    ("Episodes", "multi-turn environments: turns and counters per episode", (r"env/.+",)),
    ("Held-out grading", "held-out problems whose grader failed or that were cut off",
     (r"eval/grader_errors", r"eval/truncated")),
)
"""(title, what it shows, key patterns): each key goes to the first plot with a matching pattern."""

PER_DOMAIN = 3
"""Best, worst and random rollouts shown per domain and run."""

SCALE_GAP = 30.0
"""Largest ratio between the magnitudes (largest absolute values) of series on one axis."""


def build_report(run_dirs: Iterable[str | Path], out: str | Path) -> Path:
    """Write the report of ``run_dirs`` to ``out`` and return its path; beside it, a picture of
    accuracy against length for each task evaluated at several lengths (``lengths.length_svgs``)."""
    runs = [load_run(Path(d)) for d in run_dirs]
    names = run_names([r["path"] for r in runs])
    for run, name in zip(runs, names):
        run["name"] = name
    maps, hidden = heatmaps(runs)
    maps += depth_heatmaps(runs)
    tables = [heldout(run) for run in runs]
    across = heldout_across(tables, names)
    drawn = panels(runs, hidden)
    at = max((i + 1 for i, p in enumerate(drawn) if re.fullmatch(r"Accuracy( \(\d+\))?", p["title"])), default=0)
    drawn[at:at] = length_panels(runs, names)  # after the accuracy plots
    data = {"runs": [{k: run[k] for k in ("name", "path", "config", "summary")} for run in runs],
            "header": [header(run) for run in runs], "panels": drawn, "alerts": alerts(runs),
            "heatmaps": maps + ([across] if across else []), "heldout": tables, "samples": browser(runs)}
    out = Path(out)
    out.write_text(render(data), encoding="utf-8")
    for name, picture in length_svgs(runs, names).items():
        (out.parent / name).write_text(picture, encoding="utf-8")
    return out


def load_run(path: Path) -> dict[str, Any]:
    """A run folder's records, samples, config text and summary (the last three may be missing)."""
    if not (path / "metrics.jsonl").is_file():
        raise ConfigError(f"{path}: not a run folder (no metrics.jsonl in it)")
    summary = path / "summary.json"
    return {"path": str(path), "metrics": read_jsonl(path / "metrics.jsonl"),
            "samples": read_jsonl(path / "samples.jsonl") if (path / "samples.jsonl").is_file() else [],
            "config": (path / "config.yaml").read_text(encoding="utf-8") if (path / "config.yaml").is_file() else "",
            "summary": json.loads(summary.read_text(encoding="utf-8")) if summary.is_file() else None}


def run_names(paths: list[str]) -> list[str]:
    """Each run's folder name, or its whole path where two names are the same."""
    names = [Path(p).name or p for p in paths]
    return [name if names.count(name) == 1 else path for name, path in zip(names, paths)]


def header(run: dict) -> dict:
    """What the report's header says of a run: model, algorithm, steps, wall time and held-out
    accuracy before and after (None where the run has not said: no summary yet, no config)."""
    try:
        config = yaml.safe_load(run["config"] or "{}")
    except yaml.YAMLError:
        config = None
    config = config if isinstance(config, dict) else {}
    algorithm = config.get("algorithm") or {}
    parts = [algorithm.get("advantage", "grpo"), algorithm.get("loss", "ppo_clip")]
    if algorithm.get("kl_coef"):
        parts.append(f"KL {algorithm['kl_coef']:g}")
    summary = run["summary"] or {}
    done = max((r["step"] for r in run["metrics"] if isinstance(r.get("step"), int)), default=0)
    wall = summary.get("wall_s")
    if wall is None:  # a run still going, or killed: the steps it logged
        wall = sum(r["step_s"] for r in run["metrics"] if _number(r.get("step_s"))) or None
    return {"name": run["name"], "model": summary.get("model") or (config.get("model") or {}).get("path"),
            "algorithm": " · ".join(parts) if config else None, "steps": done, "planned": config.get("steps"),
            "wall_s": wall, "finished": bool(summary),
            "before": (summary.get("eval_before") or {}).get("accuracy"),
            "after": (summary.get("eval_after") or {}).get("accuracy")}


def panels(runs: list[dict], hidden: list[set[str]]) -> list[dict]:
    """The plots some run has data for: title, note, axes and series (run, key, axis, [step, value]
    points); a panel whose series differ in scale becomes several (see the module docstring).
    A run's keys in ``hidden`` (drawn as heat-maps) are left out; a per-domain metric no panel
    names gets a plot of its own, titled as :func:`~tempering.reporting.domains.family_title`."""
    compiled = [(title, note, [re.compile(p + "$") for p in patterns]) for title, note, patterns in PANELS]
    found: dict[str, list[dict]] = {}
    extra: dict[str, tuple[str, str]] = {}
    for index, run in enumerate(runs):
        for key in sorted({k for record in run["metrics"] for k in record} - hidden[index]):
            title = next((t for t, _, patterns in compiled if any(p.match(key) for p in patterns)), None)
            named = split_key(key) if title is None else None
            if named is not None:
                title, note = family_title(named[0])
                extra.setdefault(named[0], (title, note))
            points = [[r["step"], r[key]] for r in run["metrics"] if _number(r.get(key)) and "step" in r]
            if title is not None and points:
                found.setdefault(title, []).append({"run": index, "key": key, "points": points})
    titled = [(title, note) for title, note, _ in PANELS] + [extra[f] for f in sorted(extra, key=family_rank)]
    shown = []
    for title, note in titled:
        groups = scale_groups(found.get(title, []))
        for part, first in enumerate(range(0, len(groups), 2)):
            pair = groups[first:first + 2]
            series = [{**s, "axis": axis} for axis, group in enumerate(pair) for s in group]
            shown.append({"title": title if part == 0 else f"{title} ({part + 1})", "note": note,
                          "axes": len(pair), "series": series})
    return shown


def scale_groups(series: list[dict]) -> list[list[dict]]:
    """``series`` grouped by magnitude, largest first, each group spanning at most SCALE_GAP;
    a key's series (one per run) stay together, and series that are all 0 join the first group.

    >>> sizes = {"ratio_mean": 1.0, "behaviour_weight": 0.98, "mismatch/abs_logp": 3e-7, "outside_clip": 0.0}
    >>> [[s["key"] for s in g] for g in scale_groups([{"key": k, "points": [[1, v]]} for k, v in sizes.items()])]
    [['ratio_mean', 'behaviour_weight', 'outside_clip'], ['mismatch/abs_logp']]
    """
    size: dict[str, float] = {}
    for s in series:
        size[s["key"]] = max(size.get(s["key"], 0.0), *(abs(v) for _, v in s["points"]))
    order = sorted(size, key=lambda k: -size[k])
    groups: list[list[str]] = []
    for key in order:
        if size[key] == 0 and groups:
            groups[0].append(key)
        elif groups and size[groups[-1][0]] <= SCALE_GAP * size[key]:
            groups[-1].append(key)
        else:
            groups.append([key])
    return [[s for key in group for s in series if s["key"] == key] for group in groups]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def alerts(runs: list[dict]) -> list[dict]:
    """Every step at which a reward-hacking monitor was past its threshold."""
    return [{"run": index, "step": record["step"], "monitor": key[len("monitor/"):-len("/alert")],
             "value": record.get(key[:-len("/alert")])}
            for index, run in enumerate(runs) for record in run["metrics"]
            for key, value in sorted(record.items()) if key.startswith("monitor/") and key.endswith("/alert") and value]


def browser(runs: list[dict]) -> list[dict]:
    """Per run and domain, the best, worst and some random samples (random: seeded, so a
    report of the same runs shows the same ones)."""
    shown = []
    for index, run in enumerate(runs):
        by_domain: dict[str, list[dict]] = {}
        for sample in run["samples"]:
            by_domain.setdefault(sample.get("domain", "?"), []).append(sample)
        for domain, samples in sorted(by_domain.items()):
            ranked = sorted(samples, key=lambda s: s.get("reward", 0.0), reverse=True)
            rest = ranked[PER_DOMAIN:-PER_DOMAIN]
            picks = {"best": ranked[:PER_DOMAIN], "worst": ranked[::-1][:PER_DOMAIN],
                     "random": random.Random(f"{index}/{domain}").sample(rest, min(PER_DOMAIN, len(rest)))}
            shown.append({"run": index, "domain": domain, "count": len(samples), **picks})
    return shown


def render(data: dict) -> str:
    """The page: the data as JSON in the page (``<`` escaped, so no text in it can close the
    script element), then the inlined style and script."""
    package = resources.files("tempering.reporting")
    payload = json.dumps(_finite(data), separators=(",", ":")).replace("<", "\\u003c")
    return PAGE.format(style=(package / "report.css").read_text(encoding="utf-8"),
                       script=(package / "report.js").read_text(encoding="utf-8"), data=payload)


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as null: JSON has no number for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tempering report</title>
<script>
window.reportErrors = [];
window.reportError = function (message) {{
  window.reportErrors.push(String(message));
  document.documentElement.dataset.errors = JSON.stringify(window.reportErrors);
}};
window.addEventListener("error", function (e) {{ window.reportError(e.message); }});
window.addEventListener("unhandledrejection", function (e) {{ window.reportError(e.reason); }});
console.error = (function (original) {{
  return function () {{ window.reportError(Array.from(arguments).join(" ")); original.apply(console, arguments); }};
}})(console.error);
</script>
<style>{style}</style></head>
<body data-rendered="0">
<h1>tempering report</h1>
<nav id="runs"></nav>
<table id="header"></table>
<h2>Plots</h2><p class="note">x: step (accuracy against length: document length in tokens, not smoothed). Hover a
point for its value; a series on the right axis is marked (right) in the legend.</p>
<p class="controls"><label>smoothing <input id="smoothing" type="range" min="0" max="0.99" step="0.01"></label>
<output id="smoothing-value"></output></p><div id="plots"></div>
<h2>Per domain</h2><p class="note">each metric logged per domain, as a domain x step heat-map where it has more
than six domains, and every share; the weakest domains are the top rows</p><div id="heatmaps"></div>
<h2>Monitor alerts</h2><div id="alerts"></div>
<h2>Held-out accuracy</h2><p class="note">per task, first and last measured; change in points, the most
dropped first</p><div id="summary"></div>
<h2>Rollouts</h2><p class="note">best, worst and random samples per domain (samples.jsonl)</p><div id="browser"></div>
<h2>Config</h2><div id="config"></div>
<script type="application/json" id="report-data">{data}</script>
<script>{script}</script>
</body></html>
"""
