"""The item a real LM is shown under a view: independent premises or options reordered, or the question in
another language (the step-reordering and language axes; docs/design.md §3).

* **Options** of a multiple-choice item are permuted and relabelled A, B, C, ... in their new order: the correct
  option's text is unchanged, its letter moves (the shown item's gold is the new letter).
* **Premises** of a word problem are the sentences before the final question sentence. Two adjacent premises
  are swapped only when neither refers back (a pronoun or a word like "then", "remaining", "left" at its
  start or in it): the facts are the same, their order is not. The first sentence, which introduces the
  subject, stays first.
* **Terms** of an arithmetic expression (``Calculate 34 + 12 - 5``): the top-level additive terms are
  permuted with their signs, and the permuted expression is evaluated to check that its value is unchanged.
* **Language**: the item's stored translation (same gold answer) replaces the question.

An order is a tuple of indices into the original units (options, premises or terms); :func:`reorder` finds
one for an item, :func:`shown_item` applies a view's order and language to an item.
"""

from __future__ import annotations

import ast
import random
import re
from dataclasses import replace
from typing import TYPE_CHECKING

from sift.errors import SiftError
from sift.lm.arithmetic import exact_value, question_expression

if TYPE_CHECKING:  # pragma: no cover
    from sift.lm.items import LMItem
    from sift.lm.prompts import LMView

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
#: a premise that refers back to another (it cannot move before what it refers to)
_REFERS_BACK = re.compile(
    r"^\s*(?:he|she|they|it|his|her|their|its|this|that|these|those|then|after|afterwards|later|next|also|"
    r"finally|so|but|and|however|each|both|there)\b"
    r"|\b(?:remaining|rest|left|leftover|then|after that|afterwards|later|again|more|another|other|same|"
    r"twice|half|times as|as many|as much|total|that|those|these|them|this|it)\b",
    re.IGNORECASE)


# ------------------------------------------------------------------------------------------------- options

def option_order(item: LMItem, rng: random.Random) -> tuple[int, ...] | None:
    """A non-identity permutation of a multiple-choice item's options (None without two options)."""
    if not item.choices or len(item.choices) < 2:
        return None
    n = len(item.choices)
    order = list(range(n))
    while order == list(range(n)):
        rng.shuffle(order)
    return tuple(order)


def _permute_options(item: LMItem, order: tuple[int, ...]) -> tuple[tuple[tuple[str, str], ...], dict[str, str]]:
    """The options in ``order``, relabelled A, B, ...; and old label → new label."""
    old = item.choices or ()
    if sorted(order) != list(range(len(old))):
        raise SiftError(f"item {item.item_id}: option order {order} is not a permutation of {len(old)} options")
    new = tuple((LETTERS[k], old[j][1]) for k, j in enumerate(order))
    return new, {old[j][0]: LETTERS[k] for k, j in enumerate(order)}


def relabel(item: LMItem, order: tuple[int, ...], label: str | None) -> str | None:
    """Where an option label of the original item moves under an option ``order`` (a cue's value, say)."""
    if label is None or not item.choices:
        return label
    return _permute_options(item, order)[1].get(label, label)


# ------------------------------------------------------------------------------------------------- premises

def split_premises(question: str) -> tuple[list[str], str] | None:
    """(premise sentences, the rest from the first question sentence on), or None when there is no final
    question sentence or fewer than two premises."""
    sentences = [s for s in _SENTENCE_END.split(question.strip()) if s]
    q = next((i for i, s in enumerate(sentences) if "?" in s), None)
    if q is None or q < 2:
        return None
    return sentences[:q], " ".join(sentences[q:])


def premise_order(question: str) -> tuple[int, ...] | None:
    """A swap of two adjacent independent premises (never the first), or None when no pair is independent."""
    split = split_premises(question)
    if split is None:
        return None
    premises, _ = split
    for i in range(1, len(premises) - 1):
        a, b = premises[i], premises[i + 1]
        if not _REFERS_BACK.search(a) and not _REFERS_BACK.search(b) and re.search(r"\d", a + b):
            order = list(range(len(premises)))
            order[i], order[i + 1] = order[i + 1], order[i]
            return tuple(order)
    return None


# ------------------------------------------------------------------------------------------------- terms

def _terms(node: ast.AST, sign: str = "+") -> list[tuple[str, ast.AST]]:
    """The top-level additive terms of an expression, each with its sign."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        return _terms(node.left, sign) + [("+" if isinstance(node.op, ast.Add) else "-", node.right)]
    return [(sign, node)]


def _render_terms(expr: str, order: tuple[int, ...]) -> str | None:
    """The expression with its additive terms in ``order`` (a negative term written with a minus sign, not as
    ``+ -3``), or None when the reordered text does not have the same exact value."""
    try:
        tree = ast.parse(expr, mode="eval").body
        terms = _terms(tree)
        if sorted(order) != list(range(len(terms))):
            return None
        parts = []
        for k, j in enumerate(order):
            sign, node = terms[j]
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):  # + (-3) → - 3, - (-3) → + 3
                sign, node = ("-" if sign == "+" else "+"), node.operand
            text = ast.get_source_segment(expr, node) or ast.unparse(node)
            parts.append(("-" if sign == "-" else "") + text if k == 0 else f" {sign} {text}")
        out = "".join(parts)
        return out if exact_value(out) == exact_value(expr) else None
    except (SyntaxError, ValueError, RecursionError):
        return None


def term_order(question: str) -> tuple[int, ...] | None:
    """A permutation of the top-level additive terms of the question's expression that keeps its value and
    changes its text (``10 + 10`` has none)."""
    found = question_expression(question)
    if found is None:
        return None
    try:
        n = len(_terms(ast.parse(found[2], mode="eval").body))
    except SyntaxError:
        return None
    if n < 2:
        return None
    for order in (tuple(range(1, n)) + (0,), tuple(reversed(range(n)))):
        if order != tuple(range(n)) and _render_terms(found[2], order) not in (None, found[2]):
            return order
    return None


# ------------------------------------------------------------------------------------------------- the view

def reorder(item: LMItem, rng: random.Random) -> tuple[str, tuple[int, ...]] | None:
    """How ``item`` can be reordered, keeping its answer: ("options" | "premises" | "terms", order), or None."""
    if item.choices:
        order = option_order(item, rng)
        return None if order is None else ("options", order)
    order = premise_order(item.question)
    if order is not None:
        return "premises", order
    order = term_order(item.question)
    return None if order is None else ("terms", order)


def reordered_question(question: str, unit: str, order: tuple[int, ...]) -> str:
    if unit == "premises":
        split = split_premises(question)
        if split is None or sorted(order) != list(range(len(split[0]))):
            raise SiftError(f"premise order {order} does not fit the question {question[:60]!r}")
        return " ".join([split[0][j] for j in order] + [split[1]])
    if unit == "terms":
        found = question_expression(question)
        expr = None if found is None else _render_terms(found[2], order)
        if expr is None:
            raise SiftError(f"term order {order} does not fit the question {question[:60]!r}")
        return question[:found[0]] + expr + question[found[1]:]
    raise SiftError(f"unknown reordering unit {unit!r}")


def translation(item: LMItem, language: str) -> str | None:
    return dict(item.translations or ()).get(language)


def shown_item(item: LMItem, view: LMView) -> LMItem:
    """The item as the view shows it: translated, premises/terms/options reordered (gold relabelled)."""
    if view.language is not None:
        q = translation(item, view.language)
        if q is None:
            raise SiftError(f"item {item.item_id} has no {view.language!r} translation")
        item = replace(item, question=q)
    if view.order is None:
        return item
    unit, order = view.order_unit, tuple(view.order)
    if unit == "options":
        choices, moved = _permute_options(item, order)
        return replace(item, choices=choices, answer=moved[item.answer])
    return replace(item, question=reordered_question(item.question, unit, order))


__all__ = ["option_order", "premise_order", "relabel", "reorder", "reordered_question", "shown_item",
           "split_premises", "term_order", "translation"]
