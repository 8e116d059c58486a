"""HumanEval problems as sandbox test specs, with parent-side verdicts where possible.

HumanEval's tests are a ``check(candidate)`` function full of asserts, meant to run in the
same process as the candidate, where the candidate can forge them. Most asserts have a
shape the parent can judge itself: ``candidate(<literals>) == <literal>`` (either side),
``... is True/False/None``, bare ``candidate(...)`` / ``not candidate(...)``, and
``abs(candidate(...) - <literal>) < <literal>``. When every statement of ``check`` has
one of these shapes the problem becomes ``call`` cases; otherwise (random inputs, loops,
helper functions) it runs as a whole program and its verdict is marked ``program``.

Arguments and expected values are read with :func:`ast.literal_eval` plus arithmetic on
literals (bounded, so ``"a" * 10**9`` is refused); nothing from the dataset is executed
in the parent. Statements without effect (``assert True``, a bare ``print``) are skipped.
"""

from __future__ import annotations

import ast
import operator

from tempering.sandbox.spec import CallCase, Tests, TestSpec

_FOLD = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
         ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
         ast.Pow: operator.pow}
_MAX_REPEAT = 10_000
_MAX_EXPONENT = 64


class _NotConvertible(Exception):
    pass


def humaneval_spec(problem: dict, completion: str, timeout_s: float = 3.0,
                   memory_mb: int = 512) -> TestSpec:
    """The test spec for one completion of a HumanEval problem (``prompt``, ``test``,
    ``entry_point`` as in the dataset); ``completion`` follows the prompt."""
    code = problem["prompt"] + completion
    entry = problem["entry_point"]
    try:
        cases = call_cases(problem["test"])
    except _NotConvertible:
        program = f"{code}\n\n{problem['test']}\n\ncheck({entry})\n"
        return TestSpec("python", program, Tests("program"), timeout_s, memory_mb)
    return TestSpec("python", code, Tests("call", tuple(cases), entry), timeout_s, memory_mb)


def call_cases(test_source: str) -> list:
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
        if _has_no_effect(statement):
            continue
        if not isinstance(statement, ast.Assert):
            raise _NotConvertible(type(statement).__name__)
        cases.append(_case(statement.test))
    if not cases:
        raise _NotConvertible("no asserts")
    return cases


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


def _case(test: ast.expr) -> CallCase:
    if _is_candidate_call(test):
        return CallCase(_args(test), None, "truthy")
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and _is_candidate_call(test.operand):
        return CallCase(_args(test.operand), None, "falsy")
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        raise _NotConvertible("unsupported assert")
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if isinstance(op, ast.Eq):
        call, other = (left, right) if _is_candidate_call(left) else (right, left)
        if _is_candidate_call(call):
            return CallCase(_args(call), _literal(other), "eq")
    if isinstance(op, ast.Is) and _is_candidate_call(left):
        expected = _literal(right)
        if expected is True or expected is False or expected is None:
            return CallCase(_args(left), expected, "json")
    if isinstance(op, (ast.Lt, ast.LtE)):
        return _approx_case(left, right)
    raise _NotConvertible("unsupported comparison")


def _approx_case(left: ast.expr, right: ast.expr) -> CallCase:
    """``abs(candidate(...) - v) < tol``; the tolerance check in the parent uses ``<=``,
    so the bound is narrowed by one ulp-scale margin to keep ``<`` semantics."""
    if not (isinstance(left, ast.Call) and isinstance(left.func, ast.Name)
            and left.func.id == "abs" and len(left.args) == 1):
        raise _NotConvertible("unsupported bound")
    inner = left.args[0]
    if not (isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Sub)
            and _is_candidate_call(inner.left)):
        raise _NotConvertible("unsupported bound")
    tolerance = _literal(right)
    return CallCase(_args(inner.left), _literal(inner.right), "approx", float(tolerance) * (1 - 1e-12))


def _is_candidate_call(node: ast.expr) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "candidate" and not node.keywords)


def _args(call: ast.Call) -> list:
    return [_literal(arg) for arg in call.args]


def _literal(node: ast.expr):
    """A literal, or arithmetic on literals (``[0] * 5``, ``2.0/3.0``), evaluated safely."""
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_literal(item) for item in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.BinOp) and type(node.op) in _FOLD:
        left, right = _literal(node.left), _literal(node.right)
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
