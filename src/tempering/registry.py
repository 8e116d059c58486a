"""The one mechanism behind every registry (advantages, losses, rewards, tasks, ...).

A registry is a plain ``dict`` from name to object. :func:`add` puts an entry in, refusing
a name twice; :func:`resolve` looks one up, or imports it when written ``module:attribute``
so users plug their own in from the config without registering anything.
"""

from __future__ import annotations

import importlib
from typing import Any, TypeVar

T = TypeVar("T")


def add(registry: dict[str, Any], kind: str, name: str, entry: T, **attributes: Any) -> T:
    """Register ``entry`` under ``name``, setting ``attributes`` on it; returns it unchanged.

    >>> table = {}
    >>> add(table, "loss", "double", lambda x: 2 * x)(3)
    6
    >>> add(table, "loss", "double", abs)
    Traceback (most recent call last):
    ValueError: loss 'double' is registered twice
    """
    if name in registry:
        raise ValueError(f"{kind} {name!r} is registered twice")
    for key, value in attributes.items():
        setattr(entry, key, value)
    registry[name] = entry
    return entry


def resolve(registry: dict[str, Any], name: str, kind: str) -> Any:
    """Look ``name`` up in ``registry``, or import it when written as ``module:attribute``."""
    if name in registry:
        return registry[name]
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot import {kind} {name!r}: {exc}") from exc
    known = ", ".join(sorted(registry))
    raise ValueError(f"unknown {kind} {name!r}; known: {known}, or module:function")
