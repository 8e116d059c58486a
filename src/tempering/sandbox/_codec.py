"""Tagged JSON for values that cross the sandbox boundary (call arguments, return values).

Plain JSON cannot tell a tuple from a list or carry sets, so every JSON object on the
wire is a one-key tag: ``{"d": [[k, v], ...]}`` a dict, ``{"t": [...]}`` a tuple,
``{"s": [...]}`` a set, ``{"f": [...]}`` a frozenset, ``{"b": hex}`` bytes,
``{"c": [re, im]}`` a complex number, ``{"x": "nan"|"inf"|"-inf"}`` a non-finite float.
Because no untagged object is ever produced, a program cannot smuggle a tag inside a dict.

Only exact builtin types are encoded; subclasses (an ``int`` whose ``__eq__`` always says
yes, a ``str`` with a custom ``__hash__``) are refused, so what the trusted parent decodes
is plain data whose comparison no program code can influence.

This file is imported both by the parent and, by path, inside the sandbox, so it uses
the standard library only.
"""

import json
import math

_SCALARS = (str, int, bool, type(None))


def encode(value):
    """Return a JSON-ready structure for ``value``; raise ``TypeError`` for anything else."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is float:
        return value if math.isfinite(value) else {"x": repr(value)}
    if kind is list:
        return [encode(item) for item in value]
    if kind is tuple:
        return {"t": [encode(item) for item in value]}
    if kind is dict:
        return {"d": [[encode(k), encode(v)] for k, v in value.items()]}
    if kind is set or kind is frozenset:
        items = [encode(item) for item in value]
        items.sort(key=lambda item: json.dumps(item, sort_keys=True))
        return {"s" if kind is set else "f": items}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is complex:
        return {"c": [encode(value.real), encode(value.imag)]}
    raise TypeError(f"cannot return a value of type {kind.__name__!r} from the sandbox")


_DECODERS = {
    "t": lambda items: tuple(decode(item) for item in items),
    "s": lambda items: {decode(item) for item in items},
    "f": lambda items: frozenset(decode(item) for item in items),
    "d": lambda pairs: {decode(k): decode(v) for k, v in pairs},
    "b": bytes.fromhex,
    "c": lambda parts: complex(decode(parts[0]), decode(parts[1])),
    "x": float,
}


def decode(data):
    """Inverse of :func:`encode`; raise ``ValueError`` on anything it could not have made."""
    if isinstance(data, list):
        return [decode(item) for item in data]
    if isinstance(data, dict):
        if len(data) != 1:
            raise ValueError("tagged value must have exactly one key")
        (tag, payload), = data.items()
        if tag not in _DECODERS:
            raise ValueError(f"unknown tag {tag!r}")
        try:
            return _DECODERS[tag](payload)
        except (TypeError, AttributeError) as err:
            raise ValueError(f"malformed {tag!r} value") from err
    if isinstance(data, (str, int, float, bool)) or data is None:
        return data
    raise ValueError(f"unexpected JSON value of type {type(data).__name__}")


def dumps(value) -> str:
    """Encode ``value`` and serialise it to one line of JSON."""
    return json.dumps(encode(value), separators=(",", ":"))


def loads(text: str):
    """Parse one line made by :func:`dumps`."""
    return decode(json.loads(text))
