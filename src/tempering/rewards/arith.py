"""A tiny, safe arithmetic evaluator for checking model-written steps like ``4*6+4=28``.

Model text is never handed to ``eval``: this is a recursive-descent parser over numbers,
``+ - * / ^ **``, unary minus and parentheses, computing exactly with fractions. It bounds
what hostile text can cost: input length, nesting depth, digits per number, exponent size
and the size of every intermediate result, so ``9**9**9**9`` is refused in microseconds.

Grammar::

    expr   := term (('+' | '-') term)*
    term   := factor (('*' | 'x' | '×' | '/' | '÷') factor)*
    factor := ('-' | '+') factor | power
    power  := atom (('^' | '**') factor)?
    atom   := number | '(' expr ')'

Not done here: variables, functions, implicit multiplication.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Optional

MAX_CHARS = 200
MAX_DEPTH = 20
MAX_DIGITS = 60
MAX_EXPONENT = 64
MAX_RESULT_BITS = 4096

_TOKEN = re.compile(r"\s*(\d+(?:\.\d+)?|\*\*|[-+*/^()x×÷])")


class NotArithmetic(ValueError):
    """Text that is not a bounded arithmetic expression."""


def _tokens(text: str) -> list[str]:
    tokens, pos = [], 0
    text = text.replace("\u2212", "-").rstrip()
    while pos < len(text):
        found = _TOKEN.match(text, pos)
        if not found:
            raise NotArithmetic(f"unexpected {text[pos:pos + 10]!r}")
        tokens.append(found.group(1))
        pos = found.end()
    return tokens


def _bounded(value: Fraction) -> Fraction:
    if value.numerator.bit_length() > MAX_RESULT_BITS or value.denominator.bit_length() > MAX_RESULT_BITS:
        raise NotArithmetic("result too large")
    return value


class _Parser:
    def __init__(self, tokens: list[str]):
        self.tokens, self.pos, self.depth = tokens, 0, 0

    def peek(self) -> Optional[str]:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise NotArithmetic("expression ends early")
        self.pos += 1
        return token

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op, right = self.take(), self.term()
            value = _bounded(value + right if op == "+" else value - right)
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "x", "×", "/", "÷"):
            op, right = self.take(), self.factor()
            if op in ("/", "÷"):
                if right == 0:
                    raise NotArithmetic("division by zero")
                value = _bounded(value / right)
            else:
                value = _bounded(value * right)
        return value

    def factor(self) -> Fraction:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise NotArithmetic("nested too deeply")
        try:
            if self.peek() in ("-", "+"):
                sign = -1 if self.take() == "-" else 1
                return sign * self.factor()
            return self.power()
        finally:
            self.depth -= 1

    def power(self) -> Fraction:
        base = self.atom()
        if self.peek() in ("^", "**"):
            self.take()
            exponent = self.factor()
            if exponent.denominator != 1 or abs(exponent) > MAX_EXPONENT:
                raise NotArithmetic("exponent must be a whole number of at most 64")
            if base == 0 and exponent < 0:
                raise NotArithmetic("division by zero")
            return _bounded(base ** int(exponent))
        return base

    def atom(self) -> Fraction:
        token = self.take()
        if token == "(":
            value = self.expr()
            if self.take() != ")":
                raise NotArithmetic("unbalanced parenthesis")
            return value
        if token[0].isdigit():
            if len(token) > MAX_DIGITS:
                raise NotArithmetic("number too long")
            return Fraction(token)
        raise NotArithmetic(f"unexpected {token!r}")


def evaluate(text: str) -> Fraction:
    """The exact value of an arithmetic expression, or :class:`NotArithmetic`.

    >>> evaluate("4*6+4"), evaluate("(1+2)^2 - 10/4"), evaluate("−3 × 2")
    (Fraction(28, 1), Fraction(13, 2), Fraction(-6, 1))
    >>> evaluate("9**9**9**9")
    Traceback (most recent call last):
    ...
    tempering.rewards.arith.NotArithmetic: exponent must be a whole number of at most 64
    """
    if len(text) > MAX_CHARS:
        raise NotArithmetic("expression too long")
    parser = _Parser(_tokens(text))
    value = parser.expr()
    if parser.peek() is not None:
        raise NotArithmetic(f"unexpected {parser.peek()!r}")
    return value


def try_evaluate(text: str) -> Optional[Fraction]:
    """:func:`evaluate`, or None for anything that is not a bounded expression.

    >>> try_evaluate("7+8"), try_evaluate("__import__('os')"), try_evaluate("2**")
    (Fraction(15, 1), None, None)
    """
    try:
        return evaluate(text)
    except (NotArithmetic, ValueError, ZeroDivisionError, OverflowError):
        return None
