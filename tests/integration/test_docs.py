"""The handbook builds with ``mkdocs build --strict`` (a broken link, a missing anchor, a page
left out of the navigation or named there but absent fails it), offline; the generated
configuration reference holds every config field with its description, and the API
reference every exported name."""

import html
import re
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

import tempering
from tempering.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("mkdocs")
pytest.importorskip("material")
pytest.importorskip("mkdocstrings")


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` in ``root``; not ``-q``, which hides the warnings strict mode counts."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src"), "NO_MKDOCS_2_WARNING": "1",
           "HOME": str(site.parent)}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    result = _build(ROOT, out)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _fields() -> list[tuple[str, typing.Any]]:
    """(dotted key, field) of every config field, each class under the first path that reaches it."""
    found, queue, seen = [], [("", TrainConfig)], set()
    while queue:
        prefix, model = queue.pop(0)
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            found.append((prefix + name, field))
            stack = [(field.annotation, "")]
            while stack:
                annotation, suffix = stack.pop()
                if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                    queue.append((f"{prefix}{name}{suffix}.", annotation))
                    continue
                origin, args = typing.get_origin(annotation), typing.get_args(annotation)
                marks = {list: "[N]", dict: ".<name>"}
                stack += [(a, suffix + marks.get(origin, "")) for a in (args[-1:] if origin in marks else args)]
    return found


def _text(cell: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", cell)).split())


def test_every_config_field_is_in_the_reference_with_its_type_default_and_description(site):
    page = (site / "configuration" / "index.html").read_text()
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", page, re.S):
        cells = [_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        if len(cells) == 5:
            rows[cells[0]] = cells
    fields = _fields()
    assert len(fields) > 150
    for key, field in fields:
        assert key in rows, f"{key} is not in the configuration reference"
        if field.description:
            assert rows[key][4] == " ".join(field.description.split()), key
    assert rows["rollout.group_size"][1:4] == ["int", "8", "≥ 2"]
    assert rows["pipeline.mode"][1:3] == ["sync or async", '"sync"']
    assert rows["tasks[N].env.max_turns"][3] == "≥ 1"


def test_every_exported_name_is_in_the_api_reference(site):
    page = (site / "python-api" / "index.html").read_text()
    for name, module in tempering.EXPORTS.items():
        assert f'id="{module}.{name}"' in page, name
    assert "<blockquote>" not in page, "docstring examples render as code"
    assert ":class:" not in page


def test_the_threat_model_is_the_sandbox_docstring_and_nothing_is_fetched(site):
    sandbox = (site / "sandbox" / "index.html").read_text()
    assert "escape to the host" in sandbox and "Not covered" in sandbox
    for page in site.rglob("*.html"):
        text = page.read_text()
        assert not re.search(r'<(?:link|script)[^>]+(?:href|src)="https?://', text), f"{page} loads from the network"


def test_every_readme_link_into_the_handbook_reaches_its_page_and_anchor(site, readme_links):
    anchored = [(path, anchor) for path, anchor in readme_links if path.startswith("docs/") and anchor]
    assert anchored, "the README links no section of the handbook"
    for path, anchor in anchored:
        name = Path(path).stem
        page = site / ("index.html" if name == "index" else f"{name}/index.html")
        assert page.is_file(), f"README links {path}, which the site does not have"
        assert f'id="{anchor}"' in page.read_text(), f"README links {path}#{anchor}: no such anchor on the page"


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


@pytest.mark.parametrize("damage, message", [
    (lambda root: _append(root / "docs" / "concepts.md", "\n[gone](nowhere.md)\n"), "nowhere.md"),
    (lambda root: _append(root / "docs" / "concepts.md", "\n[gone](commands.md#no-such-anchor)\n"), "no-such-anchor"),
    (lambda root: (root / "docs" / "orphan.md").write_text("# Orphan\n"), "orphan.md"),
    (lambda root: (root / "docs" / "benchmarks.md").unlink(), "benchmarks.md"),
])
def test_a_broken_link_or_a_missing_page_fails_the_build(tmp_path, damage, message):
    for name in ("docs", "examples"):
        shutil.copytree(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / "mkdocs.yml", tmp_path)
    (tmp_path / "src").symlink_to(ROOT / "src")
    damage(tmp_path)
    result = _build(tmp_path, tmp_path / "site")
    assert result.returncode != 0 and message in result.stderr, result.stderr[-2000:]
