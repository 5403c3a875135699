"""parse_answer: only the last answer line counts; numbers, letters and booleans read robustly."""

import pytest

from sift.errors import SiftError
from sift.lm.parsing import answer_segment, canonical_answer, infer_kind, normalize_number, parse_answer


@pytest.mark.parametrize("text,expected", [
    ("Answer: 42", "42"),
    ("answer: 42", "42"),
    ("ANSWER : 42", "42"),
    ("So the answer is 17.", "17"),
    ("**Answer:** 8", "8"),
    ("**Answer**: 8", "8"),
    ("Final answer is: -3", "-3"),
    ("Answer: \u22127", "-7"),
    ("Answer: 1,234,567", "1234567"),
    ("Answer: $1,234.50", "1234.5"),
    ("Answer: 12.0", "12"),
    ("Answer: 0.25", "0.25"),
    ("Answer: -0.5", "-0.5"),
    ("Answer: 3/4", "3/4"),
    ("Answer: -3/4", "-3/4"),
    ("Answer: 6/3", "2"),
    ("Answer: \\frac{3}{4}", "3/4"),
    ("The result is \\boxed{\\frac{1}{2}}.", "1/2"),
    ("so we get $\\boxed{144}$ in total", "144"),
    ("Answer: 42%", "42"),
    ("Answer: 5 km, after 3 hours", "5"),  # the first number, not a trailing one
    ("Answer: 12 apples (step 3)", "12"),
    ("Answer: 5 - 3 - 6 = -4", "-4"),  # an equation: its result
    ("Answer: 7.", "7"),
    ("Answer:\n\n  **15**", "15"),  # the value on the next line
])
def test_numeric(text, expected):
    assert parse_answer(text, "numeric") == expected


def test_only_the_last_answer_line_counts():
    text = "Step 1: 3 + 4 = 7\nI first thought the answer is 9.\nStep 2: 7 * 2 = 14\nAnswer: 14\n"
    assert parse_answer(text, "numeric") == "14"
    assert parse_answer("Answer: 3\nwait, recheck\nAnswer: 5", "numeric") == "5"
    # the last marker on the line wins
    assert parse_answer("I guess the answer is 4. Answer: 6", "numeric") == "6"
    # numbers in the CoT after the answer line do not count; a later line without marker is ignored
    assert parse_answer("Answer: 8\nThis took 3 steps.", "numeric") == "8"


@pytest.mark.parametrize("text", [
    "", "Step 1: 3 + 4 = 7\nStep 2: 7 * 2 = 14", "The total is 14.", "Answer: none", "the answers: 5",
    "Answer: x2",
])
def test_numeric_none(text):
    assert parse_answer(text, "numeric") is None


@pytest.mark.parametrize("text,expected", [
    ("Answer: B", "B"),
    ("Answer: (c)", "C"),
    ("The answer is (D).", "D"),
    ("Answer: [E]", "E"),
    ("Answer: B) 42 apples", "B"),
    ("Answer: C. Paris", "C"),
    ("Answer: A", "A"),  # the sole token
    ("Answer: A.", "A"),
    ("Answer: **D**", "D"),
    ("Answer: option C", "C"),
    ("The answer is C because B is too small.", "C"),
    ("Answer: A because the train is faster", "A"),
    ("Answer: The correct option is D", "D"),  # 'T' of "The" is not an option
    ("Answer: Paris", "C"),  # the text of an option
])
def test_choice(text, expected):
    choices = [("A", "London"), ("B", "Rome"), ("C", "Paris"), ("D", "Oslo"), ("E", "Bern")]
    assert parse_answer(text, "choice", choices=choices) == expected


@pytest.mark.parametrize("text", [
    "Answer: A train leaves at noon",  # the article, not an option
    "Answer: Because of Energy",  # capitals inside words
    "Answer: 42",
    "Option B looks right.",  # no answer line
    "Answer: F",
])
def test_choice_none(text):
    assert parse_answer(text, "choice") is None


def test_choice_custom_labels():
    assert parse_answer("Answer: (F)", "choice", labels=["E", "F"]) == "F"


@pytest.mark.parametrize("text,expected", [
    ("Answer: True", "True"), ("Answer: false.", "False"), ("the answer is yes", "True"),
    ("Answer: No, it is not", "False"), ("Answer: **FALSE**", "False"),
])
def test_boolean(text, expected):
    assert parse_answer(text, "boolean") == expected


def test_boolean_none():
    assert parse_answer("Answer: maybe", "boolean") is None
    assert parse_answer("It is true.", "boolean") is None


def test_free():
    assert parse_answer("so\nAnswer: **blue whale**.", "free") == "blue whale"
    assert parse_answer("\\boxed{\\text{x+1}}", "free") == "x+1"
    assert parse_answer("no marker", "free") is None
    assert parse_answer("Answer:", "free") is None


def test_unknown_kind():
    with pytest.raises(SiftError, match="unknown answer kind"):
        parse_answer("Answer: 1", "date")


def test_helpers():
    assert answer_segment("x\nAnswer: 4 apples") == " 4 apples"
    assert normalize_number("+1,000") == "1000"
    assert normalize_number("2.500") == "2.5"
    assert normalize_number("4/0") is None
    assert canonical_answer("1,200", "numeric") == "1200"
    assert canonical_answer("(B)", "choice") == "B"
    assert canonical_answer("Yes", "boolean") == "True"
    assert infer_kind("-61") == "numeric" and infer_kind("3/4") == "numeric"
    assert infer_kind("False") == "boolean" and infer_kind("x + 1") == "free"
