"""Accuracy against length in ``temper report``: for each task evaluated at several lengths (a
``long_context`` curriculum, ``eval.problems_per_length``), one plot whose x axis is the
document length in tokens and whose lines are the evaluations, before, every ``eval.every``
steps and after, coloured from dark (first) to light (last), so a reader sees at once how far
along the lengths the model holds and how training moved that edge.

The points come from ``summary.json`` (``eval_before`` and ``eval_after``'s ``by_length``) and
from the step records' ``eval/<task>/len_<L>`` keys; a run that logged none gets no such plot,
and those keys are kept out of the step plots and the held-out tables (their x axis is a
step, and the task's held-out accuracy at its current level is already there).

Where the model reads (``by_depth``, :func:`depth_heatmaps`): a heat-map of each evaluation
before and after training, lengths down and the depth of the evidence in the document across.

The same curves as a picture of their own (:func:`length_svg`), which ``temper report`` writes
beside the page, one SVG file per run and task, for a README or a paper.

Not done: interpolating between lengths, a log-scale length axis in the HTML plot (the picture has one), depth at the evaluations
between (only their accuracy by length is logged per step).
"""

from __future__ import annotations

import math
import re
from typing import Any

from tempering.reporting.svg import Line, accuracy_chart

LENGTH_KEY = re.compile(r"eval/(.+)/len_(\d+)$")
"""A step record's key of held-out accuracy at one length: task, length."""

NOT_LENGTH = r"(?!.+/len_\d+$)"
"""A regular-expression guard that keeps :data:`LENGTH_KEY` keys out of a pattern over ``eval/``."""


def evaluations(run: dict) -> dict[str, list[tuple[str, dict[int, float]]]]:
    """Per task, its evaluations at several lengths in the order they were made: a label
    ("before", "step N", "after") and accuracy by length (lengths never graded left out).

    >>> run = {"summary": {"eval_before": {"by_length": {"lc": {"256": 1.0, "512": None}}}},
    ...        "metrics": [{"step": 4, "eval/lc/len_256": 1.0, "eval/lc/len_512": 0.5, "eval/lc": 1.0}]}
    >>> evaluations(run)
    {'lc': [('before', {256: 1.0}), ('step 4', {256: 1.0, 512: 0.5})]}
    """
    summary = run.get("summary") or {}
    found: dict[str, list[tuple[str, dict[int, float]]]] = {}
    _add(found, "before", (summary.get("eval_before") or {}).get("by_length") or {})
    for record in run["metrics"]:
        if not isinstance(record.get("step"), int):
            continue
        curves: dict[str, dict[str, Any]] = {}
        for key, value in record.items():
            named = LENGTH_KEY.match(key)
            if named:
                curves.setdefault(named.group(1), {})[named.group(2)] = value
        _add(found, f"step {record['step']}", curves)
    _add(found, "after", (summary.get("eval_after") or {}).get("by_length") or {})
    return found


def _add(found: dict[str, list], label: str, curves: dict[str, dict[str, Any]]) -> None:
    for task, curve in curves.items():
        points = {int(length): value for length, value in curve.items() if _number(value)}
        if points:
            found.setdefault(task, []).append((label, dict(sorted(points.items()))))


def length_panels(runs: list[dict], names: list[str]) -> list[dict]:
    """One plot per run and task evaluated at several lengths, in the form of the step plots'
    panels (see ``html.panels``) with ``x``, the unit of its x axis: a series per evaluation,
    its points [length, accuracy]."""
    shown = []
    for index, run in enumerate(runs):
        for task, made in sorted(evaluations(run).items()):
            where = f" · {names[index]}" if len(runs) > 1 else ""
            shown.append({"title": f"Accuracy against length · {task}{where}", "x": "tokens",
                          "note": "held-out accuracy at each length (eval.problems_per_length problems each), "
                                  "one line per evaluation, dark first and light last",
                          "axes": 1, "series": [{"run": index, "key": label, "axis": 0,
                                                 "points": [[length, value] for length, value in curve.items()]}
                                                for label, curve in made]})
    return shown


def depth_heatmaps(runs: list[dict]) -> list[dict]:
    """Per run and task with accuracy by evidence depth (``by_depth`` in the summary's
    evaluations), a heat-map of each of its evaluations, before and after: a row per length
    (shortest first), a column per depth bin (the document's start first), each row's accuracy
    over all its problems at the right end. The form of ``domains.heatmap``'s, with ``axis``
    "depth"; a needle-in-a-haystack picture of where along a long document a model stops
    finding what it reads, and of what training moved.

    >>> run = {"summary": {"eval_after": {"by_length": {"lc": {"256": 0.5}},
    ...                                   "by_depth": {"lc": {"256": {"0-50%": 0.0, "50-100%": 1.0}}}}}}
    >>> [(m["title"], m["rows"], m["columns"], m["cells"], m["last"]) for m in depth_heatmaps([run])]
    [('Accuracy by length and evidence depth · lc · after', ['256'], ['0-50%', '50-100%'], [[0.0, 1.0]], [0.5])]
    """
    shown = []
    for index, run in enumerate(runs):
        summary = run.get("summary") or {}
        for when in ("before", "after"):
            evaluation = summary.get(f"eval_{when}") or {}
            for task, grid in sorted((evaluation.get("by_depth") or {}).items()):
                rows = sorted(grid, key=int)
                columns = list(dict.fromkeys(label for length in rows for label in grid[length]))
                overall = (evaluation.get("by_length") or {}).get(task) or {}
                shown.append({"run": index, "family": "depth", "title": f"Accuracy by length and evidence depth · {task} · {when}",
                              "note": "held-out greedy accuracy at each length (eval.problems_per_length problems) split "
                                      "by how deep in the document the evidence starts; grey: no problem there",
                              "rows": rows, "axis": "depth", "columns": columns,
                              "cells": [[grid[length].get(label) for label in columns] for length in rows],
                              "last": [overall.get(length) for length in rows], "low": 0.0, "high": 1.0,
                              "palette": "sequential", "order": "by length, shortest first"})
    return shown


SVG_COLOURS = {"before": "#7a869a", "after": "#d95f02"}
"""Line colours of the two evaluations drawn: grey before training, orange after; any other
label (a run with neither) is drawn in the report's blue."""


def length_svg(made: list[tuple[str, dict[int, float]]], title: str) -> str:
    """One task's evaluations (:func:`evaluations`' list for it) as a standalone SVG: lengths
    across on a log-2 scale, held-out accuracy up, a labelled line for "before" and one for
    "after" (those between are left to the HTML report, so the picture stays readable; a run
    with neither gets every evaluation).

    >>> svg = length_svg([("before", {256: 1.0, 4096: 0.25}), ("step 5", {256: 1.0, 4096: 0.5}),
    ...                   ("after", {256: 1.0, 4096: 1.0})], "lc")
    >>> svg.count("<polyline"), "step 5" in svg, ">4096<" in svg, svg.startswith("<svg")
    (2, False, True, True)
    """
    kept = [(label, curve) for label, curve in made if label in ("before", "after")] or made
    lengths = sorted({length for _, curve in kept for length in curve})
    low, high = math.log2(lengths[0]), math.log2(lengths[-1])

    def across(length: float) -> float:
        return (math.log2(length) - low) / (high - low) if high > low else 0.5

    lines = [Line(list(curve.items()), SVG_COLOURS.get(label, "#3f6fb5"), label, dots=True) for label, curve in kept]
    return accuracy_chart(title, across=across, ticks=[(length, str(length)) for length in lengths],
                          x_label="document length (tokens), held-out greedy accuracy", lines=lines,
                          legend=[(line.title, line.colour) for line in lines])


def length_svgs(runs: list[dict], names: list[str]) -> dict[str, str]:
    """File name -> :func:`length_svg` picture, for every run and task evaluated at several
    lengths: ``accuracy-by-length-<task>.svg`` (the run's name before the task's when there are
    several runs; characters other than letters, digits, ``.``, ``-`` and ``_`` as ``_``)."""
    pictures = {}
    for index, run in enumerate(runs):
        for task, made in sorted(evaluations(run).items()):
            where = f"{names[index]}-" if len(runs) > 1 else ""
            name = re.sub(r"[^\w.-]", "_", f"accuracy-by-length-{where}{task}") + ".svg"
            title = f"Accuracy against length · {task}" + (f" · {names[index]}" if len(runs) > 1 else "")
            pictures[name] = length_svg(made, title)
    return pictures


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
