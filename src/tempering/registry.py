"""The one mechanism behind every registry (advantages, losses, rewards, tasks, ...).

A registry is a plain ``dict`` from name to object. :func:`add` puts an entry in, refusing
a name twice; :func:`resolve` looks one up, or imports it when written ``module:attribute``
so users plug their own in from the config without registering anything. Entries whose
modules are slow to import (or register more entries) can be named in a ``lazy`` table
instead: they are imported on first use, and listed with the rest when a name is unknown.
:func:`typed_options` checks an entry's options from the config against its signature.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Optional, TypeVar

from pydantic import ConfigDict, TypeAdapter, ValidationError

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


def resolve(registry: dict[str, Any], name: str, kind: str, lazy: Optional[dict[str, str]] = None,
            classes: bool | str = False) -> Any:
    """Look ``name`` up in ``registry`` or ``lazy``, or import it when written as ``module:attribute``.

    ``lazy`` maps a name, or a family prefix ending in ``:`` (``rg:``), to ``module:attribute``.
    An imported entry must be a function, or also a class when ``classes`` is true (a string
    names the method such a class must have). Anything else is refused here, with its name,
    rather than failing when first called in the middle of a run.

    >>> resolve({}, "math:pi", "loss")
    Traceback (most recent call last):
    ValueError: loss math:pi is a float, not a function
    """
    if name in registry:
        return registry[name]
    lazy = lazy or {}
    prefix, colon, _ = name.partition(":")
    target = lazy.get(prefix + colon) if colon else lazy.get(name)
    if target is None and colon:
        target = name
    if target is None:
        known = ", ".join(sorted({*registry, *(n + "<type>" if n.endswith(":") else n for n in lazy)}))
        raise ValueError(f"unknown {kind} {name!r}; known: {known}, or module:function")
    module_name, _, attr = target.partition(":")
    try:
        entry = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {kind} {name!r}: {exc}") from None
    _check_shape(entry, name, kind, classes)
    return entry


def _check_shape(entry: Any, name: str, kind: str, classes: bool | str) -> None:
    wanted = "a function or class" if classes else "a function"
    if inspect.isclass(entry):
        if not classes:
            raise ValueError(f"{kind} {name} is a class, not a function")
        if isinstance(classes, str) and not callable(getattr(entry, classes, None)):
            raise ValueError(f"{kind} {name} is a class without a {classes} method")
    elif inspect.ismodule(entry):
        raise ValueError(f"{kind} {name} is a module, not {wanted}")
    elif not callable(entry):
        raise ValueError(f"{kind} {name} is a {type(entry).__name__}, not {wanted}")


ANY_CLASS = ConfigDict(arbitrary_types_allowed=True)
"""A type pydantic has no schema for (a class of the entry's own) is checked with isinstance."""


def typed_options(factory: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    """``options`` checked against the types ``factory``'s signature gives them, and converted
    where pydantic's lax mode would (``"3"`` for an ``int`` is 3), so that a wrong type is a
    ValueError naming the option and the type wanted rather than a TypeError from inside the
    task or reward, or a value taken for what it is not (``"maybe"`` for a ``bool``). An option
    the signature leaves untyped or does not name (a ``**kwargs`` factory's) passes as it is; so
    do all of them when the signature cannot be read."""
    try:
        parameters = inspect.signature(factory, eval_str=True).parameters
    except (TypeError, ValueError, NameError):  # a builtin, or annotations that name what is not there
        return options
    typed = dict(options)
    for key, value in options.items():
        annotation = parameters[key].annotation if key in parameters else Any
        if annotation in (Any, inspect.Parameter.empty):
            continue
        try:
            typed[key] = TypeAdapter(annotation, config=ANY_CLASS).validate_python(value)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"])
            raise ValueError(f"options.{key}={value!r}: expected {_type_name(annotation)} "
                             f"({where + ': ' if where else ''}{error['msg']})") from None
    return typed


def _type_name(annotation: Any) -> str:
    return annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")
