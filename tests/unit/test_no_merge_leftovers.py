"""No tracked text file holds a merge's conflict markers: a page or a module with
``<<<<<<<`` / ``=======`` / ``>>>>>>>`` lines left in it reads as two versions at once (a
config or module would not even load; a Markdown page renders both halves without a word)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.MULTILINE)


def tracked_text_files() -> list[Path]:
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    suffixes = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".json", ""}
    return [ROOT / name for name in listed.splitlines() if Path(name).suffix in suffixes and (ROOT / name).is_file()]


def test_no_tracked_file_holds_conflict_markers():
    leftovers = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        leftovers += [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}" for m in MARKER.finditer(text)]
    assert not leftovers, f"conflict markers left by a merge: {', '.join(leftovers)}"
