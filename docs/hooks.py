"""MkDocs hooks: the pages that are generated from the code, so that they cannot drift from it.

- ``<!-- config-reference -->`` becomes the configuration reference: a section per config
  class (``tempering.config``), a row per field with its type, default, bounds and
  description, as pydantic holds them;
- ``<!-- api-reference -->`` becomes one mkdocstrings block per name that ``tempering``
  exports (``tempering.EXPORTS``), in the table's order;
- ``<!-- docstring: MODULE -->`` becomes the module's docstring, read from its source file
  (not imported), which is already Markdown apart from Sphinx's roles;
- Sphinx roles in rendered text (``:class:`~tempering.sandbox.RunResult```) read as code.

Nothing here fetches anything: the build works offline.
"""

from __future__ import annotations

import ast
import json
import re
import typing
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if "<!-- config-reference -->" in markdown:
        markdown = markdown.replace("<!-- config-reference -->", config_reference())
    if "<!-- api-reference -->" in markdown:
        markdown = markdown.replace("<!-- api-reference -->", api_reference())
    return re.sub(r"<!-- docstring: ([\w.]+) -->", lambda m: module_docstring(m.group(1)), markdown)


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """``:class:`~a.b.C``` reads ``C`` (``a.b.C`` without the tilde), as Sphinx shows it."""
    def role(match: re.Match) -> str:
        name = match.group(2)
        return f"<code>{name.rsplit('.', 1)[-1] if name.startswith('~') else name}</code>"
    return re.sub(r":(class|func|mod|meth|data|attr|exc):<code>([^<]+)</code>", role, html)


def module_docstring(module: str) -> str:
    path = SOURCE.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def api_reference() -> str:
    import tempering

    return "\n".join(f"::: {module}.{name}\n" for name, module in tempering.EXPORTS.items())


def config_reference() -> str:
    """A section per config class, in the order they are first reached from TrainConfig."""
    from tempering.config import TrainConfig

    sections: dict[type, list[str]] = {TrainConfig: [""]}
    order = [TrainConfig]
    for model in order:  # grows as nested classes are found: a breadth-first walk
        for name, field in model.model_fields.items():
            for nested, suffix in _nested(field.annotation):
                path = f"{sections[model][0]}{name}{suffix}"
                if nested not in sections:
                    sections[nested] = []
                    order.append(nested)
                sections[nested].append(path + ".")
    return "\n".join(_section(model, sections) for model in order)


def _nested(annotation: Any) -> list[tuple[type, str]]:
    """The config classes inside a field's type, with the path suffix that reaches them
    (``[N]`` for a list entry, ``.<name>`` for a dict value)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, "")]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list:
        return [(m, "[N]" + s) for m, s in _nested(args[0])]
    if origin is dict:
        return [(m, ".<name>" + s) for m, s in _nested(args[1])]
    return [found for arg in args for found in _nested(arg)]


def _anchor(model: type) -> str:
    return "config-" + model.__name__.lower()


def _section(model: type, sections: dict[type, list[str]]) -> str:
    paths = [p.rstrip(".") for p in sections[model]]
    title = f"`{paths[0]}`" if paths[0] else "top level"
    also = f" Also at {', '.join(f'`{p}`' for p in paths[1:])}." if len(paths) > 1 else ""
    doc = " ".join((model.__doc__ or "").split())
    lines = [f"### {title} {{ #{_anchor(model)} }}", "", f"{doc}{also}".strip(), "",
             "| key | type | default | bounds | description |", "| --- | --- | --- | --- | --- |"]
    prefix = sections[model][0]
    for name, field in model.model_fields.items():
        nested = _nested(field.annotation)
        description = _plain(field.description or "")
        if nested and not field.description:
            description = f"section: see [{nested[0][0].__name__}](#{_anchor(nested[0][0])})"
        cells = [f"`{prefix}{name}`", _type(field.annotation, sections), _default(field), _bounds(field), description]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _plain(text: str) -> str:
    """``text`` shown as written: Markdown's emphasis and HTML characters escaped."""
    return re.sub(r"([*_\\`\[\]])", r"\\\1", text).replace("<", "&lt;").replace(">", "&gt;")


def _type(annotation: Any, sections: dict[type, list[str]]) -> str:
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{_anchor(annotation)})"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin is typing.Union or type(annotation).__name__ == "UnionType":
        return " or ".join(_type(a, sections) for a in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type(a, sections) for a in args)}]"
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(its section's defaults)"
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        value = [v.model_dump(exclude_defaults=True) for v in value]
    return f"`{json.dumps(value)}`"


BOUNDS = {annotated_types.Ge: ("≥", "ge"), annotated_types.Gt: (">", "gt"), annotated_types.Le: ("≤", "le"),
          annotated_types.Lt: ("<", "lt")}


def _bounds(field: Any) -> str:
    found = []
    for item in field.metadata:
        if type(item) in BOUNDS:
            sign, attribute = BOUNDS[type(item)]
            found.append(f"{sign} {getattr(item, attribute)}")
        elif isinstance(item, annotated_types.MinLen):
            found.append(f"at least {item.min_length} entries")
        elif getattr(item, "pattern", None):
            found.append(f"matches `{item.pattern}`")
    return ", ".join(found)
