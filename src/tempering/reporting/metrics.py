"""Where metrics go: one JSON object per step in ``metrics.jsonl``, and tables for people."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsWriter:
    """Appends one JSON line per record and flushes it, so a killed run keeps every step."""

    def __init__(self, path: Path):
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def json_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The lines of a JSONL file that hold a JSON object, each with its object; any other line
    (the torn last line a killed run leaves, above all) is left out."""
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            found.append((line, record))
    return found


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a file's lines (see :func:`json_lines`)."""
    return [record for _, record in json_lines(path)]


def truncate_metrics(path: Path, last_step: int) -> int:
    """Keep only the records of steps up to ``last_step`` (and no torn last line); return how
    many lines were dropped. Used on resume, so a run's metrics have no gaps and no repeats."""
    if not path.exists():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line for line, record in json_lines(path) if record.get("step", 0) <= last_step]
    dropped = len(lines) - len(kept)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    tmp.replace(path)
    return dropped


def before_after_table(before: dict, after: dict) -> str:
    """A plain-text table of held-out accuracy per task, before and after training.

    A ``grader errors`` column (before -> after) appears when any problem's grader failed;
    those problems are outside the accuracies, and a task with none graded reads ``n/a``.
    A ``truncated`` column appears when any completion hit the length limit, with a closing
    line saying that those count as wrong.

    >>> print(before_after_table({"accuracy": 0.25, "per_task": {"add": 0.25}},
    ...                          {"accuracy": 0.75, "per_task": {"add": 0.75}}))
    task    before   after   change
    add      25.0%   75.0%    +50.0
    mean     25.0%   75.0%    +50.0
    """
    names = list(before["per_task"]) + ["mean"]
    extra = [(title, key) for title, key in (("grader errors", "grader_errors"), ("truncated", "truncated"))
             if any(_count(result, key, "mean") for result in (before, after))]
    rows = [("task", "before", "after", "change") + tuple(title for title, _ in extra)]
    for name in names:
        b = before["accuracy"] if name == "mean" else before["per_task"][name]
        a = after["accuracy"] if name == "mean" else after["per_task"].get(name, float("nan"))
        change = "n/a" if a is None or b is None else f"{100 * (a - b):+.1f}"
        rows.append((name, _percent(b), _percent(a), change)
                    + tuple(f"{_count(before, key, name)} -> {_count(after, key, name)}" for _, key in extra))
    width = max(len(r[0]) for r in rows) + 2
    table = "\n".join(f"{r[0]:<{width}}{r[1]:>8}{r[2]:>8}{r[3]:>9}{''.join(f'{c:>15}' for c in r[4:])}".rstrip()
                      for r in rows)
    if any(key == "truncated" for _, key in extra):
        table += ("\ntruncated: completions cut off at eval.max_new_tokens, graded as written (mostly wrong); "
                  "raise eval.max_new_tokens if the model's answers need more")
    return table


def by_round_table(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> str:
    """Held-out greedy accuracy by round (``greedy[round<=r]``, task -> metric -> value or
    None), before and after training, with each task's last round minus its first: what
    the feedback turns add.

    >>> print(by_round_table({"code": {"greedy[round<=1]": 0.25, "greedy[round<=3]": 0.25}},
    ...                      {"code": {"greedy[round<=1]": 0.25, "greedy[round<=3]": 0.5}}))
    task  metric            before   after   change
    code  greedy[round<=1]   25.0%   25.0%     +0.0
    code  greedy[round<=3]   25.0%   50.0%    +25.0
    code  last - first        +0.0   +25.0    +25.0
    """
    rows = [("task", "metric", "before", "after", "change")]
    for task, metrics in before.items():
        for metric, b in metrics.items():
            a = after[task][metric]
            rows.append((task, metric, _percent(b), _percent(a), "n/a" if a is None or b is None else f"{100 * (a - b):+.1f}"))
        gaps = [_gap(list(values.values())) for values in (metrics, after[task])]
        rows.append((task, "last - first", *("n/a" if g is None else f"{100 * g:+.1f}" for g in gaps),
                     "n/a" if None in gaps else f"{100 * (gaps[1] - gaps[0]):+.1f}"))
    widths = [max(len(r[i]) for r in rows) + 2 for i in range(2)]
    return "\n".join(f"{r[0]:<{widths[0]}}{r[1]:<{widths[1]}}{r[2]:>6}{r[3]:>8}{r[4]:>9}".rstrip() for r in rows)


def components_table(before: dict, after: dict) -> str:
    """The held-out means of the components each task's metric summarizes (evaluation's
    ``components``: task -> component -> mean), before and after training, as plain numbers
    (a rate such as ``fixed`` is a share; ``test_runs`` a count per episode).

    >>> print(components_table({"components": {"repo": {"fixed": 0.25, "test_runs": 0.5}}},
    ...                        {"components": {"repo": {"fixed": 0.5, "test_runs": 1.0}}}))
    task  component  before   after   change
    repo  fixed       0.250   0.500   +0.250
    repo  test_runs   0.500   1.000   +0.500
    """
    rows = [("task", "component", "before", "after", "change")]
    for task, means in after.get("components", {}).items():
        for name, a in means.items():
            b = before.get("components", {}).get(task, {}).get(name)
            rows.append((task, name, "n/a" if b is None else f"{b:.3f}", f"{a:.3f}",
                         "n/a" if b is None else f"{a - b:+.3f}"))
    widths = [max(len(r[i]) for r in rows) + 2 for i in range(2)]
    return "\n".join(f"{r[0]:<{widths[0]}}{r[1]:<{widths[1]}}{r[2]:>6}{r[3]:>8}{r[4]:>9}".rstrip() for r in rows)


def _gap(values: list) -> float | None:
    return None if not values or values[0] is None or values[-1] is None else values[-1] - values[0]


def _count(result: dict, key: str, name: str) -> int:
    """Problems counted under ``key`` (grader errors, truncated) for one task or (``mean``) all;
    results saved before these were counted have none."""
    counts = result.get(key, {})
    return sum(counts.values()) if name == "mean" else counts.get(name, 0)


def _percent(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"
