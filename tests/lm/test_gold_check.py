"""Golds recomputed exactly on load (sift.lm.gold_check, sift.lm.arithmetic) and well-formed reordered views."""

import random
from fractions import Fraction

import pytest

from sift.lm.arithmetic import Unsupported, exact_value, expressions, finite_decimal, question_expression
from sift.lm.gold_check import arithmetic_formula, bind_values, check_gold, template_values
from sift.lm.items import ItemSpec, LMItem, load_item_specs
from sift.lm.views import reorder, reordered_question

REAL_SMALL_ARITHMETIC = {"min_terms": 2, "max_terms": 3, "max_digits": 2, "operators": ["+", "-", "*"],
                         "allow_parentheses": False, "allow_negation": False}


@pytest.mark.parametrize("expr,value", [
    ("6 + 10 * 0", 6), ("3 + 2 * 3", 9), ("100 - 94 * 84", -7796), ("-33 - 65 + 5", -93), ("(3 + 4) * 2", 14),
    ("7 / 2", Fraction(7, 2)), ("1 / 3 * 3", 1), ("0.1 + 0.2", Fraction(3, 10)), ("2 ** 10", 1024),
    ("int(7 / 2)", 3), ("int(-7 / 2)", -3), ("17 // 5", 3), ("round(5 / 2)", 2), ("round(7 / 2)", 4),
])
def test_exact_value_uses_python_precedence_in_rationals(expr, value):
    assert exact_value(expr) == value


def test_exact_value_errors():
    with pytest.raises(ValueError, match="division by zero"):
        exact_value("3 / (2 - 2)")
    for bad in ("__import__('os')", "x + 1", "[1, 2]", "3 if 1 else 2", "2 ** 1000", "3 +"):
        with pytest.raises(Unsupported):
            exact_value(bad)
    assert exact_value("x * k", {"x": Fraction(10), "k": Fraction(1, 2)}) == 5


def test_finite_decimal():
    assert [finite_decimal(Fraction(a, b)) for a, b in ((6, 1), (-5, 2), (1, 8), (-1, 20), (1, 3))] == [
        "6", "-2.5", "0.125", "-0.05", None]


def test_expressions_in_questions_stop_before_the_full_stop():
    assert question_expression("Calculate 6 + 10 * 0.") == (10, 20, "6 + 10 * 0")
    assert question_expression("Calculate -33 - 65 + 5.")[2] == "-33 - 65 + 5"
    assert question_expression("Solve 2.5 * 4 - 1.")[2] == "2.5 * 4 - 1"
    assert question_expression("What is (3 + 4) * 2?")[2] == "(3 + 4) * 2"
    assert question_expression("Tom has 3 apples.") is None
    q = "Is 3 + 4 more than 2 * 3?"
    assert len(expressions(q)) == 2 and arithmetic_formula(q) is None


# reasoning-gym's basic_arithmetic evaluates "*" after "+"/"-" left to right (0.1.19 ... 0.1.25): its golds
@pytest.mark.parametrize("question,upstream,right", [
    ("Calculate 6 + 10 * 0.", "0", "6"), ("Calculate 3 + 2 * 3.", "15", "9"),
    ("Calculate 100 - 94 * 84.", "504", "-7796"),
])
def test_reasoning_gyms_known_wrong_golds_are_corrected(question, upstream, right):
    assert check_gold(upstream, arithmetic_formula(question)) == ("corrected", right,
                                                                 f"gold {upstream} ≠ exact value {right}")
    assert check_gold(right, arithmetic_formula(question))[:2] == ("ok", right)


def test_the_rule_for_rounded_and_unreadable_golds():
    assert check_gold("0.33", "1 / 3")[:2] == ("ok", "0.33")  # the source's rounding, not an error
    assert check_gold("0.5", "1 / 3")[:2] == ("dropped", None)  # wrong, and 1/3 has no finite decimal
    assert check_gold("2", "1 / 0")[:2] == ("dropped", None)
    assert check_gold("2", "sides_val * 2")[:2] == ("unchecked", "2")  # a name the question does not give
    assert check_gold("2", None) == ("unchecked", "2", "no formula")


def test_symbolic_gsm_formula_at_the_questions_values():
    annotated = "{name,Benny} saw a {x,10}-foot shark with {k,2} {y,6}-inch remoras. What percentage ...?"
    values = template_values(annotated)
    assert values == {"x": 10, "k": 2, "y": 6}
    formula = bind_values("int((k * y)/ (x * 12) * 100)", values)
    assert exact_value(formula) == 10 and check_gold("10", formula)[0] == "ok"
    assert check_gold("12", formula)[:2] == ("corrected", "10")
    assert bind_values("n * frac_val", {"n": Fraction(-3, 2)}) == "-(3 / 2) * frac_val"  # unknown names stay
    assert exact_value(bind_values("n * 2", {"n": Fraction(-3, 2)})) == -3


def test_loading_corrects_golds_and_replaces_dropped_items(monkeypatch):
    """load_item_specs checks every item with a formula: a wrong gold is corrected, an item whose gold cannot be
    right is dropped and the source's next item takes its place (the report counts both)."""
    from sift.lm import items as items_mod

    def loader(spec, n, seed):
        pool = [LMItem("a", "d", "Calculate 6 + 10 * 0.", "0", "numeric", gold_formula="6 + 10 * 0"),
                LMItem("b", "d", "Calculate 1 / 3.", "0.5", "numeric", gold_formula="1 / 3"),
                LMItem("c", "d", "Calculate 4 - 1.", "3", "numeric", gold_formula="4 - 1"),
                LMItem("e", "d", "Tom has 3 apples.", "3", "numeric")]
        return pool[:n]

    monkeypatch.setitem(items_mod.ITEM_LOADERS, "fake", loader)
    report = {}
    got = load_item_specs([ItemSpec(kind="fake", n=3)], 3, gold_report=report)
    assert [(it.item_id, it.answer) for it in got] == [("a", "6"), ("c", "3"), ("e", "3")]
    r = report["items[0] (fake)"]
    assert (r["checked"], r["ok"], r["corrected"], r["dropped"], r["unchecked"]) == (3, 1, 1, 1, 1)
    assert [c["item_id"] for c in r["changes"]] == ["a", "b"]


def test_real_smalls_arithmetic_items_are_checked_on_load():
    """The real_small arithmetic source: item 00007 ("Calculate 6 + 10 * 0.", upstream gold 0) is corrected to 6,
    and every gold equals its question's exact value."""
    pytest.importorskip("reasoning_gym")
    report = {}
    spec = ItemSpec(kind="reasoning_gym", task="basic_arithmetic", domain="arithmetic", n=40,
                    options=REAL_SMALL_ARITHMETIC)
    got = load_item_specs([spec], 40, gold_report=report)
    by_id = {it.item_id: it for it in got}
    item = by_id["basic_arithmetic-0-00007"]
    assert item.question == "Calculate 6 + 10 * 0." and item.answer == "6"
    assert all(exact_value(arithmetic_formula(it.question)) == Fraction(it.answer) for it in got)
    r = report["items[0] (reasoning_gym basic_arithmetic)"]
    assert r["checked"] == 40 and r["corrected"] >= 1 and r["dropped"] == 0


def test_every_reordered_arithmetic_prompt_is_well_formed_and_keeps_its_value():
    """The term-reordering view of 300 real_small arithmetic items: each reordered question parses, ends with
    the sentence's full stop outside the expression, and has the original's exact value."""
    pytest.importorskip("reasoning_gym")
    from sift.lm.items import from_reasoning_gym

    n = 0
    for it in from_reasoning_gym("basic_arithmetic", 300, 0, REAL_SMALL_ARITHMETIC):
        how = reorder(it, random.Random(0))
        if how is None:  # one additive term ("10 * 5"), or terms that read the same in any order ("10 + 10")
            expr = question_expression(it.question)[2]
            assert "+" not in expr.lstrip("-").replace("- ", "+ ") or len(set(expr.split(" + "))) == 1
            continue
        q = reordered_question(it.question, *how)
        expr = question_expression(q)[2]
        assert q == f"Calculate {expr}." and ". " not in q and "  " not in q
        assert exact_value(expr) == exact_value(question_expression(it.question)[2])
        assert expr != question_expression(it.question)[2]
        n += 1
    assert n == 233  # of 300 (measured: the others have one additive term)


def test_a_source_whose_golds_keep_failing_stops_with_a_message(monkeypatch):
    """A generator with no end whose every gold contradicts its formula (1/3 has no finite decimal): the loader
    stops asking for more and names the source, instead of looping."""
    from sift.errors import SiftError
    from sift.lm import items as items_mod

    def loader(spec, n, seed):
        return [LMItem(f"x{i}", "d", "Calculate 1 / 3.", "0.5", "numeric", gold_formula="1 / 3") for i in range(n)]

    monkeypatch.setitem(items_mod.ITEM_LOADERS, "endless", loader)
    with pytest.raises(SiftError, match=r"items\[0\] \(endless\): .* golds their own formula contradicts"):
        load_item_specs([ItemSpec(kind="endless", n=3)], 3)
