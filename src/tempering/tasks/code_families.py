"""The function families of the procedural ``code`` task: a spec, a reference body, classic bugs.

A family is one kind of small Python function (keep the items at least k, shift letters by k,
count the fields of a line, ...) with constants drawn per problem. It has a reference body,
the bodies a learner typically writes instead (off-by-one bounds, ``>`` for ``>=``, the empty
case unhandled, the wrong initial accumulator, a missing wrap-around), a generator of
arguments and the edge cases that tell the two apart (empty input, negatives, duplicates,
values on the boundary). Every family has at least one drawn constant, so held-out problems
can differ from training problems in what is asked, not only in the hidden tests.

Families are data, not code paths: a body is a template filled with the constants, so the
pre-training corpus, the prompt and the hidden tests all come from one place. Expected values
are computed by running the reference body here, in the trusted parent; the model's program
only ever runs in the sandbox.

``level`` (1, 2 or 3) widens the constants (negatives and larger values from level 2) and
lengthens the inputs; a family may also use it for its own harder variant.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

Params = dict[str, Any]
Args = list[Any]

KINDS = ("filter", "aggregate", "number", "string", "dict_set", "parser", "recursion")
"""Kinds of families: list filters and maps, counting and aggregation, number theory, string
transforms, dict and set work, small parsers, recursion."""


@dataclass(frozen=True)
class Family:
    """One function family. ``spec`` and the bodies are ``str.format`` templates over the
    drawn constants; ``args`` is the signature's argument list, ``name`` the function's name."""

    name: str
    kind: str
    args: str
    spec: str
    body: str
    bugs: tuple[str, ...]
    constants: Callable[[random.Random, int], Params]
    draw: Callable[[random.Random, Params, int], Args]
    edges: Callable[[Params], list[Args]]
    compare: str = "json"
    hidden: tuple[str, ...] = ()
    """Constants the spec never shows (a detail left to the tests); the held-out split ignores
    them, so a held-out problem differs from every training problem in what it asks."""

    def signature(self) -> str:
        return f"def {self.name}({self.args}):"

    def source(self, params: Params, buggy: int = -1) -> str:
        """The whole function: the reference body, or bug number ``buggy``."""
        body = self.body if buggy < 0 else self.bugs[buggy]
        return self.signature() + "\n" + _indent(body.format(name=self.name, **params))

    def asked(self, params: Params) -> Params:
        """The constants the spec may show: ``params`` without the hidden ones."""
        return {key: value for key, value in params.items() if key not in self.hidden}


def _indent(body: str) -> str:
    return "".join("    " + line + "\n" for line in body.split("\n"))


def reference(family: Family, params: Params, buggy: int = -1) -> Callable[..., Any]:
    """The family's (trusted) function with ``params`` filled in, compiled in this process."""
    namespace: dict[str, Any] = {}
    exec(family.source(params, buggy), namespace)  # our own templates, never model output
    return namespace[family.name]


def run_reference(function: Callable[..., Any], args: Args) -> tuple[bool, Any]:
    """``(ok, value)`` of calling ``function`` on a copy of ``args``: ok is False when it
    raises, as a buggy body may on an edge case."""
    try:
        return True, function(*[_copy(a) for a in args])
    except Exception:  # noqa: BLE001 - a buggy reference is expected to fail on some inputs
        return False, None


def _copy(value: Any) -> Any:
    return [_copy(v) for v in value] if isinstance(value, list) else value


# -- constants and arguments --------------------------------------------------------------

def _const(rng: random.Random, level: int, low: int = 0) -> int:
    """A constant: 0..99 at level 1, -50..150 at 2, -500..500 at 3 (never below ``low``).

    Level 1 draws a hundred values, not ten, so that a quarter of them held out (see the
    ``code`` task's split) is still dozens of distinct functions per family."""
    lo, hi = {1: (0, 99), 2: (-50, 150), 3: (-500, 500)}[level]
    return rng.randint(max(lo, low), max(hi, low + 9))


def _k(low: int = 0) -> Callable[[random.Random, int], Params]:
    return lambda rng, level: {"k": _const(rng, level, low)}


def _ints(rng: random.Random, level: int, around: int = 0, spread: int = 6) -> list[int]:
    size = rng.randint(0, 3 + 2 * level)
    return [around + rng.randint(-spread, spread) for _ in range(size)]


def _list_around_k(rng: random.Random, p: Params, level: int) -> Args:
    return [_ints(rng, level, p["k"])]


def _list_edges(p: Params) -> list[Args]:
    k = p["k"]
    return [[[]], [[k]], [[k - 1, k, k + 1]], [[k, k, k - 2]], [[-abs(k) - 5, k + 3]]]


def _bounds(rng: random.Random, level: int) -> Params:
    low = _const(rng, level)
    return {"lo": low, "hi": low + rng.randint(1, 5 * level)}


def _word(rng: random.Random, low: int = 1, high: int = 7) -> str:
    return "".join(rng.choice("abcdefghij") for _ in range(rng.randint(low, high)))


def _sentence(rng: random.Random, level: int) -> str:
    return " ".join(_word(rng) for _ in range(rng.randint(0, 2 + 2 * level)))


_SEPARATORS = ",;|/:_*#&@"
"""Field separators of the parsers: none is a digit, a sign or a space."""


def _letter(rng: random.Random, level: int) -> Params:
    return {"c": rng.choice("abcdefghijklmnopqrstuvwxy")}


FAMILIES: list[Family] = [
    # -- list filters and maps --
    Family("at_least", "filter", "xs", "the items of xs that are at least {k}, in order",
           "return [x for x in xs if x >= {k}]", ("return [x for x in xs if x > {k}]",),
           _k(), _list_around_k, _list_edges),
    Family("below", "filter", "xs", "the items of xs that are less than {k}, in order",
           "return [x for x in xs if x < {k}]", ("return [x for x in xs if x <= {k}]",),
           _k(), _list_around_k, _list_edges),
    Family("between", "filter", "xs", "the items of xs from {lo} to {hi}, both included, in order",
           "return [x for x in xs if {lo} <= x <= {hi}]", ("return [x for x in xs if {lo} < x < {hi}]",),
           lambda rng, level: _bounds(rng, level),
           lambda rng, p, level: [_ints(rng, level, p["lo"], 4 + p["hi"] - p["lo"])],
           lambda p: [[[]], [[p["lo"], p["hi"]]], [[p["lo"] - 1, p["hi"] + 1]], [[p["hi"], p["lo"], p["hi"]]]]),
    Family("first_n", "filter", "xs", "the first {k} items of xs (all of them if xs is shorter)",
           "return xs[:{k}]", ("return xs[:{k} - 1]",),
           _k(1), lambda rng, p, level: [_ints(rng, level, 0, 9)],
           lambda p: [[[]], [list(range(p["k"]))], [list(range(p["k"] + 2))], [[5] * (p["k"] + 1)]]),
    Family("last_n", "filter", "xs", "the last {k} items of xs (all of them if xs is shorter)",
           "return xs[max(len(xs) - {k}, 0):]", ("return xs[-{k}:]",),
           lambda rng, level: {"k": rng.randint(0, 2 + 2 * level)},
           lambda rng, p, level: [_ints(rng, level, 0, 9)],
           lambda p: [[[]], [[1, 2, 3]], [list(range(p["k"] + 2))], [[4, 4]]]),
    Family("multiples", "filter", "xs", "the items of xs that are multiples of {k}, in order",
           "return [x for x in xs if x % {k} == 0]", ("return [x for x in xs if x % {k}]",),
           lambda rng, level: {"k": rng.randint(2, 3 + 3 * level)},
           lambda rng, p, level: [_ints(rng, level, 0, 3 * p["k"])],
           lambda p: [[[]], [[0, p["k"], p["k"] + 1]], [[-p["k"], 1]], [[2 * p["k"], 2 * p["k"]]]]),
    Family("add_each", "filter", "xs", "xs with {k} added to every item",
           "return [x + {k} for x in xs]", (),
           _k(), lambda rng, p, level: [_ints(rng, level, 0, 9)],
           lambda p: [[[]], [[0]], [[-3, 3, 3]]]),
    Family("clamp", "filter", "xs", "xs with every item above {k} replaced by {k}",
           "return [min(x, {k}) for x in xs]", ("return [x for x in xs if x <= {k}]",),
           _k(), _list_around_k, _list_edges),
    # -- counting and aggregation --
    Family("count_at_least", "aggregate", "xs", "how many items of xs are at least {k}",
           "return sum(1 for x in xs if x >= {k})", ("return sum(1 for x in xs if x > {k})",),
           _k(), _list_around_k, _list_edges),
    Family("sum_above", "aggregate", "xs", "the sum of the items of xs that are greater than {k}",
           "return sum(x for x in xs if x > {k})", ("return sum(x for x in xs if x >= {k})",),
           _k(), _list_around_k, _list_edges),
    Family("scaled_product", "aggregate", "xs", "{k} times the product of the items of xs",
           "p = 1\nfor x in xs:\n    p *= x\nreturn p * {k}", ("p = 0\nfor x in xs:\n    p *= x\nreturn p * {k}",),
           _k(1), lambda rng, p, level: [_ints(rng, 1, 0, 4)],
           lambda p: [[[]], [[1]], [[2, 3]], [[-1, 5]]]),
    Family("max_or", "aggregate", "xs", "the largest item of xs, or {k} if xs is empty",
           "if not xs:\n    return {k}\nreturn max(xs)", ("m = 0\nfor x in xs:\n    m = max(m, x)\nreturn m",),
           _k(1), lambda rng, p, level: [_ints(rng, level, -3, 8)],
           lambda p: [[[]], [[-5, -2]], [[-1]], [[p["k"] + 3, 0]]]),
    Family("min_or", "aggregate", "xs", "the smallest item of xs, or {k} if xs is empty",
           "if not xs:\n    return {k}\nreturn min(xs)", ("return min(xs)",),
           _k(), lambda rng, p, level: [_ints(rng, level, 3, 8)],
           lambda p: [[[]], [[5, 9]], [[-1, -1]], [[p["k"]]]]),
    Family("mean_or", "aggregate", "xs", "the mean of the items of xs, or {k} if xs is empty",
           "if not xs:\n    return {k}\nreturn sum(xs) / len(xs)", ("return sum(xs) / len(xs)",),
           _k(), lambda rng, p, level: [_ints(rng, level, 2, 6)],
           lambda p: [[[]], [[1, 2]], [[-4, 4, 3]]], compare="approx"),
    Family("running_total", "aggregate", "xs", "the running totals of xs, starting from {k}",
           "t = {k}\nout = []\nfor x in xs:\n    t += x\n    out.append(t)\nreturn out",
           ("t = 0\nout = []\nfor x in xs:\n    t += x\n    out.append(t)\nreturn out",),
           _k(1), lambda rng, p, level: [_ints(rng, level, 0, 5)],
           lambda p: [[[]], [[0]], [[1, -1, 2]]]),
    Family("count_equal", "aggregate", "xs", "how many items of xs equal {k}",
           "c = 0\nfor x in xs:\n    if x == {k}:\n        c += 1\nreturn c",
           ("c = 1\nfor x in xs:\n    if x == {k}:\n        c += 1\nreturn c",),
           _k(), _list_around_k, lambda p: [[[]], [[p["k"]] * 3], [[p["k"] + 1]], [[p["k"], -p["k"] - 1]]]),
    # -- number theory --
    Family("range_sum", "number", "n", "the sum of the integers from {k} to n, both included (0 if n < {k})",
           "return sum(range({k}, n + 1))", ("return sum(range({k}, n))",),
           _k(), lambda rng, p, level: [p["k"] + rng.randint(-2, 8 * level)],
           lambda p: [[p["k"]], [p["k"] - 1], [p["k"] + 1], [p["k"] + 5]]),
    Family("count_multiples", "number", "n", "how many of the integers 1 to n, both included, are multiples of {k}",
           "return sum(1 for i in range(1, n + 1) if i % {k} == 0)", ("return sum(1 for i in range(1, n) if i % {k} == 0)",),
           lambda rng, level: {"k": rng.randint(2, 3 + 3 * level)},
           lambda rng, p, level: [rng.randint(0, 10 * level * p["k"])],
           lambda p: [[0], [p["k"]], [p["k"] - 1], [3 * p["k"]], [3 * p["k"] + 1]]),
    Family("digit_sum", "number", "n", "the sum of the digits of n written in base {k} (n >= 0)",
           "s = 0\nwhile n > 0:\n    s += n % {k}\n    n //= {k}\nreturn s", ("s = 0\nwhile n > 1:\n    s += n % {k}\n    n //= {k}\nreturn s",),
           lambda rng, level: {"k": rng.randint(2, 10)},
           lambda rng, p, level: [rng.randint(0, 10 ** (1 + level))],
           lambda p: [[0], [1], [p["k"]], [p["k"] + 1], [p["k"] ** 2]]),
    Family("product_range", "number", "n", "the product of the integers from {k} to n, both included (1 if n < {k})",
           "p = 1\nfor i in range({k}, n + 1):\n    p *= i\nreturn p", ("p = 1\nfor i in range({k}, n):\n    p *= i\nreturn p",),
           lambda rng, level: {"k": rng.randint(1, 3 + 2 * level)},
           lambda rng, p, level: [p["k"] + rng.randint(-2, 9)],
           lambda p: [[p["k"]], [p["k"] - 1], [p["k"] + 2]]),
    Family("divisors_from", "number", "n", "how many divisors of n are at least {k} (n >= 1)",
           "return sum(1 for d in range({k}, n + 1) if n % d == 0)", ("return sum(1 for d in range({k}, n) if n % d == 0)",),
           lambda rng, level: {"k": rng.randint(1, 2 + 2 * level)},
           lambda rng, p, level: [rng.randint(1, 12 * level * p["k"])],
           lambda p: [[1], [p["k"]], [p["k"] * 6], [max(p["k"] - 1, 1)], [97]]),
    Family("is_prime_above", "number", "n", "True if n is a prime number greater than {k}, else False",
           "if n <= {k} or n < 2:\n    return False\nreturn all(n % d for d in range(2, int(n ** 0.5) + 1))",
           ("if n <= {k} or n < 2:\n    return False\nreturn all(n % d for d in range(2, int(n ** 0.5)))",),
           _k(), lambda rng, p, level: [max(p["k"], 0) + rng.randint(-5, 30 * level)],
           lambda p: [[p["k"]], [p["k"] + 1], [4], [9], [25], [49], [0], [1], [97]]),
    Family("gcd_with", "number", "n", "the greatest common divisor of n and {k} (n >= 0)",
           "a, b = n, {k}\nwhile b:\n    a, b = b, a % b\nreturn a", ("a, b = n, {k}\nwhile b > 1:\n    a, b = b, a % b\nreturn a",),
           lambda rng, level: {"k": rng.randint(2, 12 * level)},
           lambda rng, p, level: [rng.randint(0, 20 * level * p["k"])],
           lambda p: [[0], [p["k"]], [2 * p["k"]], [p["k"] + 1], [1]]),
    # -- string transforms --
    Family("shift_letters", "string", "s", "s with each lowercase letter moved {k} places on in the alphabet, z wrapping to a",
           "return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) for c in s)", ("return ''.join(chr(ord(c) + {k}) for c in s)",),
           lambda rng, level: {"k": rng.randint(1, 25)},
           lambda rng, p, level: [_word(rng, 0, 4 + 2 * level)],
           lambda p: [[""], ["z"], ["az"], [chr(122 - p["k"] + 1) + "a"]]),
    Family("long_words", "string", "s", "the words of s longer than {k} letters, in order, joined by '{c}'",
           "return '{c}'.join(w for w in s.split() if len(w) > {k})", ("return '{c}'.join(w for w in s.split() if len(w) >= {k})",),
           lambda rng, level: {"k": rng.randint(1, 5), "c": rng.choice("-,;+.")}, lambda rng, p, level: [_sentence(rng, level)],
           lambda p: [[""], ["a" * p["k"]], ["a" * (p["k"] + 1) + " b"], ["a" * p["k"] + " " + "b" * p["k"]]]),
    Family("rotate", "string", "s", "s with its first {k} characters moved to the end (the count wraps around len(s))",
           "if not s:\n    return s\nk = {k} % len(s)\nreturn s[k:] + s[:k]", ("k = {k} % len(s)\nreturn s[k:] + s[:k]",),
           lambda rng, level: {"k": rng.randint(1, 4 * level)}, lambda rng, p, level: [_word(rng, 1, 8)],
           lambda p: [[""], ["a"], ["ab" * p["k"]], ["abcdefghij"[: p["k"] + 1]]]),
    Family("repeat_chars", "string", "s", "the characters of s, each repeated {k} times, joined by '{c}'",
           "return '{c}'.join(ch * {k} for ch in s)", ("return '{c}'.join(ch * ({k} - 1) for ch in s)",),
           lambda rng, level: {"k": rng.randint(2, 5), "c": rng.choice("-.*#+")}, lambda rng, p, level: [_word(rng, 0, 5)],
           lambda p: [[""], ["a"], ["ab a"]]),
    Family("after_letter", "string", "s", "how many characters of s come after the letter {c} in the alphabet",
           "return sum(1 for ch in s if ch > '{c}')", ("return sum(1 for ch in s if ch >= '{c}')",),
           _letter, lambda rng, p, level: [_word(rng, 0, 10)],
           lambda p: [[""], [p["c"]], [p["c"] * 2 + "j"], ["a" + p["c"]]]),
    Family("pad_left", "string", "s", "s padded on the left with '{c}' to at least {k} characters",
           "return '{c}' * ({k} - len(s)) + s", ("return '{c}' * ({k} - len(s) - 1) + s",),
           lambda rng, level: {"c": rng.choice("*.-#_=+~"), "k": rng.randint(1, 4 + 8 * level)},
           lambda rng, p, level: [_word(rng, 0, 9)],
           lambda p: [[""], ["a" * p["k"]], ["a" * (p["k"] - 1)], ["a" * (p["k"] + 2)]]),
    # -- dict and set work --
    Family("tally_from", "dict_set", "words", "a dict from each word in the list words to {k} plus the number of times it occurs",
           "c = {{}}\nfor w in words:\n    c[w] = c.get(w, {k}) + 1\nreturn c",
           ("c = {{}}\nfor w in words:\n    c[w] = c.get(w, 0) + 1\nreturn c",),
           _k(1), lambda rng, p, level: [[rng.choice("abcd") for _ in range(rng.randint(0, 4 + 2 * level))]],
           lambda p: [[[]], [["a"]], [["a", "b", "a"]]]),
    Family("unique_above", "dict_set", "xs", "the distinct items of xs greater than {k}, in the order they first appear",
           "seen = []\nfor x in xs:\n    if x > {k} and x not in seen:\n        seen.append(x)\nreturn seen",
           ("seen = []\nfor x in xs:\n    if x >= {k} and x not in seen:\n        seen.append(x)\nreturn seen",),
           _k(), _list_around_k, _list_edges),
    Family("common_sorted", "dict_set", "xs, ys", "the distinct items found in both xs and ys that are at least {k}, sorted",
           "return sorted(x for x in set(xs) & set(ys) if x >= {k})", ("return sorted(x for x in set(xs) & set(ys) if x > {k})",),
           _k(), lambda rng, p, level: [_ints(rng, level, p["k"], 4), _ints(rng, level, p["k"], 4)],
           lambda p: [[[], [1]], [[p["k"]], [p["k"]]], [[p["k"], p["k"] + 1], [p["k"] + 1, p["k"]]]]),
    Family("missing_upto", "dict_set", "xs", "the integers from 1 to {k}, both included, that are not in xs, sorted",
           "return [i for i in range(1, {k} + 1) if i not in xs]", ("return [i for i in range(1, {k}) if i not in xs]",),
           lambda rng, level: {"k": rng.randint(2, 4 + 4 * level)},
           lambda rng, p, level: [_ints(rng, level, p["k"] // 2, p["k"] // 2 + 1)],
           lambda p: [[[]], [list(range(1, p["k"]))], [[p["k"], 0]]]),
    # -- small parsers --
    Family("sum_fields", "parser", "line", "the sum of the integers in line, separated by '{c}' (0 for an empty line)",
           "if not line:\n    return 0\nreturn sum(int(t) for t in line.split('{c}'))", ("return sum(int(t) for t in line.split('{c}'))",),
           lambda rng, level: {"c": rng.choice(_SEPARATORS)},
           lambda rng, p, level: [p["c"].join(str(v) for v in _ints(rng, level, 0, 20))],
           lambda p: [[""], ["5"], [f"-3{p['c']}3"], [f"1{p['c']}1{p['c']}1"]]),
    Family("count_fields", "parser", "line", "the number of fields in line, separated by '{c}' (0 for an empty line)",
           "if not line:\n    return 0\nreturn len(line.split('{c}'))", ("return line.count('{c}')",),
           lambda rng, level: {"c": rng.choice(_SEPARATORS)},
           lambda rng, p, level: [p["c"].join(_word(rng, 0, 3) for _ in range(rng.randint(0, 5)))],
           lambda p: [[""], ["a"], [p["c"]], [f"a{p['c']}b"]]),
    Family("max_field", "parser", "line", "the largest integer in line, separated by '{c}', or {k} for an empty line",
           "if not line:\n    return {k}\nreturn max(int(t) for t in line.split('{c}'))",
           ("return max(int(t) for t in line.split('{c}'))",),
           lambda rng, level: {"c": rng.choice(_SEPARATORS), "k": _const(rng, level)},
           lambda rng, p, level: [p["c"].join(str(v) for v in _ints(rng, level, 0, 20))],
           lambda p: [[""], ["-7"], [f"-3{p['c']}-9"], [f"4{p['c']}4"]]),
    # -- recursion --
    Family("power", "recursion", "n", "{k} to the power n, computed recursively (n >= 0)",
           "if n == 0:\n    return 1\nreturn {k} * {name}(n - 1)", ("if n == 1:\n    return {k}\nreturn {k} * {name}(n - 1)",),
           lambda rng, level: {"k": _const(rng, level, 2)},
           lambda rng, p, level: [rng.randint(0, 8 + 2 * level)],
           lambda p: [[0], [1], [2], [5]]),
    Family("nested_sum", "recursion", "xs", "the sum of every integer in the nested list xs, plus {k}",
           "t = {k}\nfor x in xs:\n    t += {name}(x) - {k} if isinstance(x, list) else x\nreturn t",
           ("t = 0\nfor x in xs:\n    t += {name}(x) if isinstance(x, list) else x\nreturn t",),
           lambda rng, level: {"k": _const(rng, level, 1)},
           lambda rng, p, level: [_nested(rng, level)],
           lambda p: [[[]], [[[]]], [[1, [2, [3]]]], [[[-1], 1]]]),
    Family("depth_plus", "recursion", "xs", "how deeply lists nest in xs (a flat list has depth 1), plus {k}",
           "return {k} + 1 + max(({name}(x) - {k} for x in xs if isinstance(x, list)), default=0)",
           ("return {k} + max(({name}(x) - {k} for x in xs if isinstance(x, list)), default=0)",),
           lambda rng, level: {"k": _const(rng, level)},
           lambda rng, p, level: [_nested(rng, level)],
           lambda p: [[[]], [[[[]]]], [[1, [2], [[3]]]]]),
]


def _nested(rng: random.Random, level: int, depth: int = 0) -> list:
    out: list = []
    for _ in range(rng.randint(0, 3)):
        if depth < level and rng.random() < 0.4:
            out.append(_nested(rng, level, depth + 1))
        else:
            out.append(rng.randint(-5, 9))
    return out


def _upper_constants(rng: random.Random, level: int) -> Params:
    keep = rng.random() < 0.5
    return {"k": _const(rng, level), "op": ">=" if keep else ">", "other": ">" if keep else ">="}


def _list_around_but_k(rng: random.Random, p: Params, level: int) -> Args:
    """A list near k without k itself: the prompt's example (a drawn case) never shows
    whether k is kept."""
    return [[x if x != p["k"] else x + 1 for x in _ints(rng, level, p["k"])]]


def _head_or_constants(rng: random.Random, level: int) -> Params:
    k, value, wrong = _const(rng, level), _const(rng, level), _const(rng, level)
    return {"k": k, "d": value, "w": wrong if wrong != value else value + 1}


def _non_empty_around_k(rng: random.Random, p: Params, level: int) -> Args:
    """A non-empty list: the prompt's example never shows what an empty one gives."""
    return [_ints(rng, level, p["k"]) or [p["k"]]]


FEEDBACK_FAMILIES: list[Family] = [
    Family("upper", "filter", "xs", "the items of xs from {k} up, in order; whether {k} itself is kept, the tests say",
           "return [x for x in xs if x {op} {k}]", ("return [x for x in xs if x {other} {k}]",),
           _upper_constants, _list_around_but_k, _list_edges, hidden=("op", "other")),
    Family("head_or", "aggregate", "xs", "the first item of xs plus {k}; for an empty xs, the value the tests say",
           "return xs[0] + {k} if xs else {d}", ("return xs[0] + {k} if xs else {w}",),
           _head_or_constants, _non_empty_around_k, lambda p: [[[]], [[0]], [[p["k"]]], [[-3, 5]]],
           hidden=("d", "w")),
]
"""Families whose spec leaves one detail to the hidden tests (``hidden`` constants, drawn per
problem): no first attempt can do better than guess it, and the first failing test (an edge
case on the boundary) tells it, so they measure whether a model uses feedback (the
``reflection`` environment). ``upper``'s detail is one of two choices, so "after a failure,
write the other one" solves it without reading the test; ``head_or``'s is a number (the value
for an empty list, its bug another number) that only the failing test's expected value gives. A task draws them only when named in ``families``; ``code`` and
its kinds never do, since a single attempt cannot learn them."""


FAMILY_BY_NAME = {family.name: family for family in FAMILIES + FEEDBACK_FAMILIES}
"""Family name -> family. The names are the functions' names, unique across kinds."""

assert len(FAMILY_BY_NAME) == len(FAMILIES) + len(FEEDBACK_FAMILIES), "family names must be unique"
assert all(family.kind in KINDS for family in FAMILIES + FEEDBACK_FAMILIES)
