"""Gold answers recomputed exactly, checked when items are loaded (docs/real_lm.md, "Items and golds").

An item source whose answer can be recomputed gives its item a ``gold_formula``: an arithmetic expression whose
exact value is the gold (reasoning-gym's arithmetic tasks: the expression the question asks for; symbolic GSM:
the template's ``#answer:`` formula at the values the question states). :func:`check_gold` evaluates it in exact
rational arithmetic with Python's precedence (``*`` and ``/`` before ``+`` and ``-``) and compares:

==============  ===================================================================================================
verdict          rule
==============  ===================================================================================================
``ok``           the gold equals the exact value, or the value has no finite decimal and the gold is it rounded to
                 the gold's own number of decimals (a rounded gold is the source's convention, not an error)
``corrected``    the gold differs and the exact value has a finite decimal: the gold becomes that value (the
                 question states what is asked; reasoning-gym's ``basic_arithmetic`` evaluates ``a + b * c`` left
                 to right, "Calculate 6 + 10 * 0." has gold 0 upstream and 6 here)
``dropped``      the gold differs and the value has no finite decimal, or the formula fails (a division by zero,
                 ``ensure_int`` of a non-integer): the item
                 is left out and the loader takes the next one
``unchecked``    the source gives no formula, or one this evaluator cannot read (a name derived in the template's
                 ``#init``, a conditional): nothing is claimed about the gold
==============  ===================================================================================================

A kinship item (reasoning-gym's ``family_relationships``) carries a ``kinship(...)`` formula instead, read by
:mod:`sift.lm.kinship` from the story the question tells: ``ok`` when the gold is the relation the story gives,
``corrected`` when it is another relation (upstream names in-laws and mixed-gender nieces/nephews from the wrong
side), ``dropped`` when the story gives the two people no single-word relation, ``unchecked`` when the story is
not in the generator's two sentence forms.

A corrected or dropped item is counted per source in the corpus manifest (``items.gold_check``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from sift.lm.arithmetic import Unsupported, exact_value, expressions, finite_decimal
from sift.lm.parsing import canonical_answer


def _decimals(gold: str) -> int:
    return len(gold.split(".", 1)[1]) if "." in gold else 0


def check_gold(gold: str, formula: str | None, names: Mapping[str, Fraction] | None = None
               ) -> tuple[str, str | None, str]:
    """(verdict, gold to use or None when dropped, why) by the module docstring's rule; ``gold`` canonical."""
    if formula is None:
        return "unchecked", gold, "no formula"
    try:
        value = exact_value(formula, names)
    except Unsupported as e:
        return "unchecked", gold, f"the formula is not read here: {e}"
    except ValueError as e:
        return "dropped", None, f"the formula cannot be evaluated: {e}"
    exact = finite_decimal(value)
    if exact is not None and canonical_answer(exact, "numeric") == gold:
        return "ok", gold, "equals the exact value"
    if exact is None:
        try:
            rounded = Fraction(gold)
        except ValueError:
            return "dropped", None, f"gold {gold!r} is not a number"
        if round(value, _decimals(gold)) == rounded:
            return "ok", gold, f"the exact value {value} rounded to {_decimals(gold)} decimals"
        return "dropped", None, f"gold {gold} ≠ {value}, which has no finite decimal"
    fixed = canonical_answer(exact, "numeric")
    return "corrected", fixed, f"gold {gold} ≠ exact value {exact}"


def check_item_gold(item: Any) -> tuple[str, str | None, str]:
    """:func:`check_gold` for an :class:`~sift.lm.items.LMItem`, its kinship formula read by
    :mod:`sift.lm.kinship` (the module docstring's rule)."""
    from sift.lm.kinship import is_kinship_formula, kinship_gold

    if not is_kinship_formula(item.gold_formula):
        return check_gold(item.answer, item.gold_formula)
    try:
        found = kinship_gold(item.gold_formula, item.question)
    except ValueError as e:
        return "unchecked", item.answer, f"the story is not read here: {e}"
    if found is None:
        return "dropped", None, "the story gives the two people no single-word relation"
    if found == item.answer:
        return "ok", item.answer, "the relation the story gives"
    return "corrected", found, f"gold {item.answer} ≠ the relation the story gives, {found}"


def arithmetic_formula(question: str) -> str | None:
    """The gold formula of a question that asks for one arithmetic expression's value (reasoning-gym's
    ``basic_arithmetic``: "Calculate 6 + 10 * 0."); None with no expression or several."""
    found = expressions(question)
    return found[0][2] if len(found) == 1 else None


def template_values(annotated: str) -> dict[str, Fraction]:
    """The numeric values a GSM-symbolic annotated question states: ``{x,10}`` → x = 10 (``{n,Benny}``, a name,
    is left out; ``1,000``-style thousands and a leading ``$`` are read as numbers)."""
    out: dict[str, Fraction] = {}
    for m in re.finditer(r"\{([A-Za-z_]\w*)\s*,\s*([^{}]+?)\s*\}", annotated):
        raw = m.group(2).replace(",", "").lstrip("$").rstrip("%")
        try:
            out.setdefault(m.group(1), Fraction(raw))
        except (ValueError, ZeroDivisionError):
            continue
    return out


def bind_values(formula: str, values: Mapping[str, Fraction]) -> str:
    """``formula`` with each name of ``values`` written as its exact value (``(3/2)``); other names stay (the
    check then reads the formula as unchecked). A formula that does not parse is returned as it is."""
    import ast

    try:
        tree = ast.parse(formula, mode="eval")
    except SyntaxError:
        return formula

    class _Bind(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            if node.id not in values:
                return node
            v = values[node.id]
            num = ast.Constant(abs(v.numerator)) if v.denominator == 1 else \
                ast.BinOp(ast.Constant(abs(v.numerator)), ast.Div(), ast.Constant(v.denominator))
            return ast.UnaryOp(ast.USub(), num) if v < 0 else num

    return ast.unparse(ast.fix_missing_locations(_Bind().visit(tree)))


def gold_check_summary(verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts of a loader's checks by verdict, with the corrected and dropped items listed."""
    out: dict[str, Any] = {"checked": 0, "ok": 0, "corrected": 0, "dropped": 0, "unchecked": 0, "changes": []}
    for v in verdicts:
        out[v["verdict"]] += 1
        out["checked"] += v["verdict"] != "unchecked"
        if v["verdict"] in ("corrected", "dropped"):
            out["changes"].append(v)
    return out


__all__ = ["arithmetic_formula", "bind_values", "check_gold", "check_item_gold", "gold_check_summary",
           "template_values"]
