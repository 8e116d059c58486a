"""The per-domain part of ``temper report``: metrics logged once per domain and step
(``domain/<name>/<metric>``, and held-out accuracy per task, ``eval/<task>``), shown so that a
run of 40 domains reads as well as one of three, and held-out accuracy first and last per task.

Each metric name forms a family (all domains' series of it), found by name, so a metric the
run logs and this file has never heard of is shown too (its title is its name). A family of at
most :data:`OVERLAY_DOMAINS` domains is drawn as lines in the ordinary plots; a larger one, and
every share (a name ending in ``_share``: of draws, tokens, reward time, the gradient), is a
domain x step heat-map, because 40 overlaid lines are one tangle and 40 small plots per metric
are a page per metric, while a heat-map is one compact picture in which rows line up and
colour is read across all of them at once. Shares are heat-maps at any count: they are read
side by side (a domain's share of draws against its share of the gradient), which needs the
same rows in the same places.

Rows run weakest first: a family where higher is better (reward, success, held-out accuracy)
is sorted by each domain's last value, lowest at the top; every other family uses the run's
own order, that of ``success`` (else ``reward``, else held-out accuracy, else by name), so the
weakest domains are the top rows of every heat-map of the run and their weights, shares and
costs sit beside them. Accuracy-like families share one colour scale, 0 to 1, so colours
compare across heat-maps and runs; the others span their own values. A run of more steps than
:data:`MAX_COLUMNS` has its steps grouped into columns of equal width, each the mean of its
steps.

Not done: sorting in the browser, zooming, per-domain statistics the run did not log.
"""

from __future__ import annotations

import math
import re
from typing import Any

from tempering.reporting.lengths import NOT_LENGTH

OVERLAY_DOMAINS = 6
"""Most domains of a family drawn as overlaid lines; more become a heat-map."""

MAX_COLUMNS = 100
"""Most step columns of a heat-map; longer runs have their steps grouped."""

HELD_OUT = "eval/"
"""The family name of held-out accuracy per task (no ``domain/`` metric can have a slash)."""

DOMAIN_KEY = re.compile(r"domain/(.+)/([^/]+)$")
EVAL_KEY = re.compile(r"eval/(?!accuracy$|grader_errors$|truncated$)" + NOT_LENGTH + r"(.+)$")

FAMILIES: dict[str, tuple[str, str]] = {
    "reward": ("Reward per domain", "mean reward of the domain's rollouts this step"),
    "success": ("Success per domain", "share of the domain's rollouts this step that solved their problem"),
    HELD_OUT: ("Held-out accuracy per task", "eval/<task>, measured every eval.every steps"),
    "weight": ("Mixture weights", "each domain's share of the next draws"),
    "draw_share": ("Share of draws", "the domain's share of the step's problems"),
    "token_share": ("Share of tokens", "the domain's share of the step's completion tokens"),
    "reward_time_share": ("Share of reward time", "the domain's share of the step's reward seconds"),
    "grad_share": ("Share of the gradient", "the domain's share of the step's gradient norm"),
    "grad_weight": ("Gradient-balance multiplier", "the domain's loss multiplier, learner.grad_balance_rate"),
    "cost_s": ("Cost per domain", "seconds one rollout of the domain costs, as measured so far"),
    "paused": ("Paused domains", "1 while the domain's grader is down and it is not drawn"),
    "completion_tokens": ("Completion tokens per domain", "the domain's completion tokens this step"),
    "spread": ("Spread per domain", "mean within-group variance of success"),
    "dropped_groups": ("Dropped groups per domain", "groups without signal dropped so far"),
    "level": ("Curriculum level per domain", "tasks with levels"),
    "length_tokens": ("Curriculum length per domain", "tokens per document at the level of a curriculum over lengths"),
}
"""Title and note of the families known by name; any other family is titled by its name."""

HIGHER_IS_BETTER = ("success", "reward", HELD_OUT)
"""Families whose rows sort by last value, lowest first; the first one a run has orders the rest."""

BOUNDED = ("success", HELD_OUT, "paused")
"""Families read on the fixed 0 to 1 colour scale (where all their values lie in it)."""


def family_title(family: str) -> tuple[str, str]:
    """The title and note of a family's plot or heat-map."""
    return FAMILIES.get(family, (f"{family} per domain", f"domain/<name>/{family}"))


def family_rank(family: str) -> tuple[int, str]:
    """Where a family's plot goes: the known ones in FAMILIES' order, then the others by name."""
    known = list(FAMILIES)
    return (known.index(family) if family in known else len(known), family)


def families(metrics: list[dict]) -> dict[str, dict[str, list[list]]]:
    """A run's per-domain series: family -> domain -> [step, value] points, finite numbers only."""
    found: dict[str, dict[str, list[list]]] = {}
    for record in metrics:
        if not isinstance(record.get("step"), int):
            continue
        for key, value in record.items():
            named = split_key(key)
            if named is not None and _number(value):
                family, domain = named
                found.setdefault(family, {}).setdefault(domain, []).append([record["step"], value])
    return found


def split_key(key: str) -> tuple[str, str] | None:
    """(family, domain) of a per-domain key, None for any other.

    >>> split_key("domain/rg:chain_sum/grad_share"), split_key("eval/add"), split_key("eval/accuracy")
    (('grad_share', 'rg:chain_sum'), ('eval/', 'add'), None)
    >>> split_key("eval/long_context/len_4096") is None  # accuracy at one length: its own plot
    True
    """
    found = DOMAIN_KEY.match(key)
    if found:
        return found.group(2), found.group(1)
    found = EVAL_KEY.match(key)
    return (HELD_OUT, found.group(1)) if found else None


def as_heatmap(family: str, series: dict[str, list]) -> bool:
    """Whether a family is drawn as a heat-map rather than lines (see the module docstring)."""
    return family.endswith("_share") or len(series) > OVERLAY_DOMAINS


def key_of(family: str, domain: str) -> str:
    """The metrics key of one domain's series of a family (the inverse of :func:`split_key`)."""
    return f"eval/{domain}" if family == HELD_OUT else f"domain/{domain}/{family}"


def heatmaps(runs: list[dict]) -> tuple[list[dict], list[set[str]]]:
    """Every run's heat-maps, and per run the keys they show (left out of the line plots)."""
    shown, hidden = [], []
    for index, run in enumerate(runs):
        found = families(run["metrics"])
        order, by = run_order(found)
        keys: set[str] = set()
        drawn = [family for family in found if as_heatmap(family, found[family])]
        for family in sorted(drawn, key=family_rank):
            shown.append(heatmap(index, family, found[family], order, by))
            keys |= {key_of(family, domain) for domain in found[family]}
        hidden.append(keys)
    return shown, hidden


def run_order(found: dict[str, dict[str, list]]) -> tuple[list[str], str | None]:
    """The run's domains weakest first by the first higher-is-better family it logged (the
    domains that family lacks after them, by name), and that family (None: all by name)."""
    domains = sorted({domain for series in found.values() for domain in series})
    by = next((f for f in HIGHER_IS_BETTER if f in found), None)
    ranking = found.get(by, {})
    return weakest_first(ranking) + [d for d in domains if d not in ranking], by


def weakest_first(series: dict[str, list]) -> list[str]:
    """Domains by their last value, lowest first, ties by name.

    >>> weakest_first({"b": [[1, 0.9], [2, 0.1]], "a": [[1, 0.5]], "c": [[2, 0.1]]})
    ['b', 'c', 'a']
    """
    return sorted(series, key=lambda domain: (series[domain][-1][1], domain))


def heatmap(run: int, family: str, series: dict[str, list], order: list[str], by: str | None) -> dict:
    """One family of one run as rows (domains) x columns (groups of steps): the cell values
    (None where the domain logged nothing in the column), each row's last value, and the
    colour scale's ends."""
    ranked = family in HIGHER_IS_BETTER
    rows = weakest_first(series) if ranked else [d for d in order if d in series]
    steps = sorted({step for points in series.values() for step, _ in points})
    columns = step_columns(steps)
    cells = []
    for domain in rows:
        at = dict(map(tuple, series[domain]))
        cells.append([_mean([at[s] for s in column if s in at]) for column in columns])
    values = [v for points in series.values() for _, v in points]
    low, high = min(values), max(values)
    if family in BOUNDED and 0 <= low and high <= 1:
        low, high = 0.0, 1.0
    elif family.endswith("_share") or family == "weight":
        low = 0.0
    title, note = family_title(family)
    order_note = ("weakest first (by last value)" if ranked else
                  f"the run's order: weakest first by last {family_title(by)[0].lower()}" if by else "by name")
    return {"run": run, "family": family, "title": title, "note": note, "rows": rows, "axis": "step",
            "columns": [[column[0], column[-1]] for column in columns], "cells": cells,
            "last": [series[d][-1][1] for d in rows], "low": low, "high": high, "palette": "sequential",
            "order": order_note}


def step_columns(steps: list[int]) -> list[list[int]]:
    """``steps`` in at most MAX_COLUMNS consecutive groups of equal size (the last shorter).

    >>> [len(c) for c in step_columns(list(range(1, 251)))][:3], len(step_columns(list(range(1, 251))))
    ([3, 3, 3], 84)
    """
    width = max(1, math.ceil(len(steps) / MAX_COLUMNS))
    return [steps[i:i + width] for i in range(0, len(steps), width)]


def heldout(run: dict) -> list[dict]:
    """Held-out accuracy per task, first and last measured, most dropped first: the summary's
    before and after evaluations where the run finished, the ``eval/<task>`` records between.

    Each row: task, first and last accuracy with where each was measured ("before", "step N",
    "after"), and the change (None where a task was measured once or never graded)."""
    summary = run.get("summary") or {}
    measured: dict[str, list[tuple[str, float]]] = {}
    before, after = summary.get("eval_before") or {}, summary.get("eval_after") or {}
    for task, value in (before.get("per_task") or {}).items():
        if _number(value):
            measured.setdefault(task, []).append(("before", value))
    for domain, points in families(run["metrics"]).get(HELD_OUT, {}).items():
        measured.setdefault(domain, []).extend((f"step {step}", value) for step, value in points)
    for task, value in (after.get("per_task") or {}).items():
        if _number(value):
            measured.setdefault(task, []).append(("after", value))
    rows = [{"task": task, "first": seen[0][1], "first_at": seen[0][0], "last": seen[-1][1],
             "last_at": seen[-1][0], "change": seen[-1][1] - seen[0][1] if len(seen) > 1 else None}
            for task, seen in measured.items()]
    return sorted(rows, key=lambda r: (r["change"] is None, r["change"] or 0.0, r["last"], r["task"]))


def heldout_across(tables: list[list[dict]], names: list[str]) -> dict | None:
    """Tasks x runs: each run's change in held-out accuracy per task (first to last), tasks
    with the lowest mean change first; None unless two runs measured a change."""
    measured = [i for i, rows in enumerate(tables) if any(r["change"] is not None for r in rows)]
    if len(measured) < 2:
        return None
    change = [{r["task"]: r["change"] for r in tables[i] if r["change"] is not None} for i in measured]
    tasks = sorted({task for run in change for task in run},
                   key=lambda t: (_mean([run[t] for run in change if t in run]), t))
    cells = [[run.get(task) for run in change] for task in tasks]
    size = max(abs(v) for row in cells for v in row if v is not None) or 1.0
    return {"run": None, "family": "heldout_change", "title": "Held-out change per task and run",
            "note": "last minus first held-out accuracy; red fell, blue rose", "rows": tasks, "axis": "run",
            "columns": [names[i] for i in measured], "cells": cells,
            "last": [_mean([v for v in row if v is not None]) for row in cells], "low": -size, "high": size,
            "palette": "diverging", "order": "lowest mean change first"}


def _mean(values: list[float]) -> Any:
    return sum(values) / len(values) if values else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
