"""The README stays a short front page: at most 15 KB, the install-and-train and
install-and-test commands in its first lines (the second exactly what CI runs), every link
pointing at a file that exists and every handbook page linked. What moved out of it lives in
``docs/``; ``tests/integration/test_docs.py`` checks the README's anchors in the built site,
``tests/unit/test_docs_commands.py`` that the ``temper`` commands it shows are accepted.
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_BYTES = 15_000


def nav_pages() -> set[str]:
    """The pages the handbook's navigation lists, as ``docs/NAME.md``."""
    def walk(entries):
        for entry in entries:
            for value in entry.values() if isinstance(entry, dict) else [entry]:
                yield from walk(value) if isinstance(value, list) else [f"docs/{value}"]
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    return set(walk(config["nav"]))


def test_the_readme_is_at_most_15_kb():
    assert README.stat().st_size <= MAX_BYTES, f"README.md is {README.stat().st_size} bytes; move detail into docs/"


def test_its_first_lines_are_the_two_commands_and_the_test_command_is_what_ci_runs():
    blocks = [line.strip() for line in README.read_text().splitlines()[:12] if line.startswith("    ")]
    assert len(blocks) == 2, blocks
    train, test = blocks
    assert train.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install") and train.endswith(
        "&& temper train"), train
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == test, f".ci/run runs {ci[-1]!r}, the README says {test!r}"


def test_every_link_points_at_a_file_and_every_docs_link_at_a_page_of_the_handbook(readme_links):
    links = readme_links
    for path, _ in links:
        assert (ROOT / path).exists(), f"README links {path}, which does not exist"
        if path.startswith("docs/") and path.endswith(".md"):  # a picture of the handbook's is a file, not a page
            assert path in nav_pages(), f"README links {path}, which is not a page of the handbook (mkdocs.yml nav)"
    linked = {path for path, _ in links}
    assert nav_pages() <= linked, f"handbook pages the README does not link: {sorted(nav_pages() - linked)}"
