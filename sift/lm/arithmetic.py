"""Exact arithmetic on the expressions that questions and templates state: one place that finds an expression in a
question (:func:`question_expression`) and evaluates it in rational arithmetic (:func:`exact_value`), for the
gold check (:mod:`sift.lm.gold_check`), the term-reordering view (:mod:`sift.lm.views`) and the EDCT rule judge
(:mod:`sift.companion.lm_edct`). Python's precedence: ``*`` and ``/`` before ``+`` and ``-``."""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Mapping
from fractions import Fraction

_NUM = r"\d+(?:\.\d+)?"  # a sentence's full stop after the last number is not part of it ("Calculate 6 + 1.")
#: an arithmetic expression in running text: numbers (the first may be negative), + - * /, parentheses
EXPRESSION = re.compile(rf"(?<![\w.])(?:-\s*)?\(*\s*{_NUM}\s*\)*(?:\s*[-+*/]\s*\(*\s*-?\s*{_NUM}\s*\)*)+")


def expressions(text: str) -> list[tuple[int, int, str]]:
    """(start, end, text) of every arithmetic expression in ``text`` (stripped of surrounding blanks)."""
    out = []
    for m in EXPRESSION.finditer(text):
        raw = m.group(0)
        body = raw.strip()
        start = m.start() + raw.index(body)
        out.append((start, start + len(body), body))
    return out


def question_expression(question: str) -> tuple[int, int, str] | None:
    """The longest arithmetic expression of a question, or None."""
    found = expressions(question)
    return max(found, key=lambda f: len(f[2])) if found else None


class Unsupported(ValueError):
    """A formula outside what :func:`exact_value` reads (not evidence against the gold)."""


_BIN: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: lambda a, b: Fraction(a // b), ast.Mod: operator.mod}


def _int(x: Fraction) -> Fraction:
    return Fraction(math.trunc(x))  # Python's int(): toward zero


def _round(x: Fraction, nd: Fraction | None = None) -> Fraction:
    if nd is None:
        return Fraction(round(x))  # Fraction rounds half to even, as Python's round of a float does
    return Fraction(round(x, int(nd)))


def _ensure_int(x: Fraction) -> Fraction:
    if x.denominator != 1:
        raise ValueError(f"ensure_int: {x} is not an integer")
    return x


_CALLS: dict[str, Callable[..., Fraction]] = {
    "int": _int, "round": _round, "abs": abs, "min": min, "max": max, "float": lambda x: x,
    "Fraction": lambda a, b=Fraction(1): Fraction(a) / Fraction(b), "ensure_int": _ensure_int}


def exact_value(expr: str, names: Mapping[str, Fraction] | None = None) -> Fraction:
    """The exact rational value of an arithmetic expression (numbers, ``names``, + - * / // % **, parentheses and
    int / round / abs / min / max / float / Fraction / ensure_int); ValueError for anything else, or a division
    by zero (:class:`Unsupported` for what it cannot read)."""
    try:
        tree = ast.parse(expr.strip(), mode="eval").body
    except SyntaxError as e:
        raise Unsupported(f"not an expression: {expr!r}") from e
    names = dict(names or {})

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
                and not isinstance(node.value, bool):
            return Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            return _BIN[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            base, exp = ev(node.left), ev(node.right)
            if exp.denominator != 1 or abs(exp) > 64:
                raise Unsupported(f"power {exp} is not a small integer")
            return base ** int(exp)
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise Unsupported(f"unknown name {node.id!r}")
            return names[node.id]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS \
                and not node.keywords:
            return Fraction(_CALLS[node.func.id](*[ev(a) for a in node.args]))
        raise Unsupported(f"unsupported in an exact formula: {ast.dump(node)[:60]}")

    try:
        return ev(tree)
    except ZeroDivisionError as e:
        raise ValueError(f"division by zero in {expr!r}") from e


def finite_decimal(x: Fraction) -> str | None:
    """``x`` written as a finite decimal (``"6"``, ``"-2.5"``), or None when it has none (1/3)."""
    d = x.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    if d != 1:
        return None
    if x.denominator == 1:
        return str(x.numerator)
    places = 0
    while (x * 10 ** places).denominator != 1:
        places += 1
    sign = "-" if x < 0 else ""
    digits = str(abs(x.numerator) * (10 ** places // x.denominator)).rjust(places + 1, "0")
    whole, frac = digits[:-places] or "0", digits[-places:]
    return f"{sign}{whole}.{frac}"




__all__ = ["EXPRESSION", "Unsupported", "exact_value", "expressions", "finite_decimal", "question_expression"]
