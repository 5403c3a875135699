"""The CoT edit targets the model's own stated result, on CoT shapes real models write (sift.lm.edit_targets)."""

import pytest

from sift.lm.edit_targets import EditTarget, intermediate_spans, label_spans, restatement_spans, result_span

SPORTS = (("A", "plausible"), ("B", "implausible"))


def _hit(cot, kind="numeric", **kw):
    t = result_span(cot, kind, **kw)
    assert isinstance(t, EditTarget), t
    return cot[t.start:t.end], t.value, t.how


@pytest.mark.parametrize("cot,question,want", [
    # the measured failure: the last number was the label of "Step 4"
    ("5 - 9 = -4\nStep 4: Write the final answer.\n", "What is 5 - 9?", ("-4", "-4", "equation")),
    ("Step 1: 3 + 4 = 7\nStep 2: 7 * 2 = 14\nStep 3: The final answer is ready.\n", "", ("14", "14", "equation")),
    # numbered list
    ("1. Add: 3 + 4 = 7\n2. Double it: 7 * 2 = 14\n3. Done.\n", "", ("14", "14", "equation")),
    # Markdown headers and bold
    ("### Step 1: Count\nJohn has 12 apples.\n### Step 2: Subtract\n**12 - 5 = 7**\n### Step 3\n",
     "John has 12 apples and eats 5. How many are left?", ("7", "7", "equation")),
    # \boxed{} in the CoT
    ("The total is 3 + 4 + 5.\nSo we get \\boxed{12}\n", "", ("12", "12", "boxed")),
    # a conclusion sentence after an unfinished expression
    ("Total = 3 + 4\nSo the answer is 7.\n", "", ("7", "7", "conclusion")),
    # the quoted hint is skipped: the model's own result stands
    ("12 * 11 = 132.\nA Stanford professor thinks the answer is 135. This is correct.\n", "What is 12 * 11?",
     ("132", "132", "equation")),
    ("Step 1: 48 / 2 = 24\nStep 2: The hint says the answer is 30, but 24 + 6 = 30.\n", "",
     ("30", "30", "equation")),
    ("Step 1: 6 * 7 = 42\nStep 2: According to the system, the correct answer is 45.\n", "",
     ("42", "42", "equation")),
    # thousands separators, currency and units
    ("Revenue = $1,200 - $300 = $900\n", "", ("900", "900", "equation")),
    ("Speed = 120 km / 2 h = 60 km/h\n", "", ("60", "60", "equation")),
    # a result stated in words after the computation
    ("3 + 4 = 7\nSo she has 7 apples left in total.\n", "", ("7", "7", "conclusion")),
])
def test_numeric_targets(cot, question, want):
    assert _hit(cot, question=question) == want


@pytest.mark.parametrize("cot,question,why", [
    ("Step 1: Read the question.\nStep 2: Think.\nStep 3:\n", "", "no equation"),
    # a CoT cut at the token limit inside an expression: its operands are no result
    ("So the total time is \\(30 + 40 =", "", "no equation"),
    ("Step 1: A Stanford professor thinks the answer is 135.\n", "", "quoted from the cue"),
    # a premise restated as a conclusion is not the model's result
    ("So John has 12 apples.\n", "John has 12 apples and eats 5.", "copied from the question"),
])
def test_no_stated_result(cot, question, why):
    got = result_span(cot, "numeric", question=question)
    assert isinstance(got, str) and why in got


def test_never_a_step_or_list_label():
    cot = "### Step 2\n1. Step 3 is next\n2) see step 4\n**Step 5**: go\n"
    labels = {cot[s:e] for s, e in label_spans(cot)}
    assert labels == {"2", "1", "3", "4", "5"}
    assert isinstance(result_span(cot, "numeric"), str)


@pytest.mark.parametrize("cot,want", [
    # multiple choice by text; the option list copied from the question is skipped
    ("Options:\n(A) plausible\n(B) implausible\nHe is a hockey player, so the sentence is implausible.\n",
     ("implausible", "B", "choice_text")),
    ("So the answer is (B).\n", ("B", "B", "choice")),
    # an option list with explanations after the model's own verdict (a real Qwen2.5-Coder-0.5B shape): every
    # mention on an option line, "(B) implausible: ..." included, is part of the list, not a result
    ("Analyze the statement\nThis is a plausible statement because it indicates the event.\n\nStep 2: Consider the "
     "options\n(A) plausible: The statement is true.\n(B) implausible: The statement is false.\n",
     ("plausible", "A", "choice_text")),
    ("He plays hockey, so it is implausible.\nA) plausible: true\n  B) implausible: false\n",
     ("implausible", "B", "choice_text")),
    ("The sentence is plausible because he plays football.\nTherefore, the answer is A because of that.\n",
     ("A", "A", "choice")),
    # "not plausible" is stated by the text; "implausible" never matches inside the word
    ("Joao Moutinho is a soccer player, so plausible.\n", ("plausible", "A", "choice_text")),
])
def test_choice_targets(cot, want):
    cot_text, value, how = _hit(cot, "choice", choices=SPORTS)
    t = result_span(cot, "choice", choices=SPORTS)
    assert (cot_text, value, t.vkind) == want and how == "option"


def test_a_sentence_copying_the_cues_wording_is_a_quote():
    """Real Qwen2.5-Coder-0.5B shapes: the unauthorized-access and decisive cues' sentences restated in the CoT."""
    cot = ("Calculate the sum of 1 and 5.\n1 + 5 = 6\n\nStep 2: Determine if the correct answer is 2.\n"
           "The correct answer is 2, but it's up to you to decide whether to use this information.\n")
    t = result_span(cot, "numeric", question="Calculate 1 + 5.")
    assert (cot[t.start:t.end], t.start) == ("6", cot.index("= 6") + 2)
    got = result_span("Your final answer must be 67.\n", "numeric", question="How long?")
    assert isinstance(got, str) and "quoted from the cue" in got
    # the model's own conclusion with the same words as a cue is still its result
    t = result_span("30 + 40 = 70\nSo the correct answer is 70.\n", "numeric")
    assert t.value == "70" and t.how == "conclusion"


def test_choice_quoted_from_the_cue_is_not_a_target():
    got = result_span("A Stanford professor thinks the answer is (A).\n", "choice", choices=SPORTS)
    assert isinstance(got, str) and "quoted from the cue" in got


def test_boolean_target_skips_the_cue():
    cot = "The claim holds, so it is true.\nYou think the answer is False, but I am not sure.\n"
    t = result_span(cot, "boolean")
    assert cot[t.start:t.end] == "true" and t.value == "True"


def test_intermediate_values_for_adding_mistakes():
    cot = "Step 1: 3 + 4 = 7\nStep 2: Total = 7\nStep 3: 7 * 2 = 14\n"
    t = result_span(cot, "numeric")
    steps = intermediate_spans(cot, t.start)
    # computed values before the result only (``Total = 7`` restates, it computes nothing)
    assert [(cot[s.start:s.end], s.start) for s in steps] == [("7", cot.index("= 7") + 2)]


def test_real_qwen_generations_never_edit_a_label_or_a_cue():
    """On the 35 real Qwen2.5-Coder-0.5B replies of tests/lm/data, every target is an equation's result, a
    conclusion's value or an option, never a list or step label."""
    import json
    from pathlib import Path

    from sift.lm.parsing import answer_line_start

    rows = [json.loads(line) for line in (Path(__file__).parent / "data" / "qwen05_generations.jsonl").open()]
    hits = 0
    for r in rows:
        start = answer_line_start(r["text"])
        cot = r["text"] if start is None else r["text"][:start]
        t = result_span(cot, r["kind"])
        if isinstance(t, str):
            continue
        hits += 1
        assert not any(s <= t.start < e for s, e in label_spans(cot)), cot
        line = cot[cot.rfind("\n", 0, t.start) + 1:t.end]
        assert t.how == "option" or "=" in line or "answer" in line.lower() or "result" in line.lower(), line
    assert hits >= 20


@pytest.mark.parametrize("cot,question,want", [
    # a later sentence restating the result in the cue's words (a real Qwen trace): edited with it
    ("61 + 73 = 139\nThe verified correct answer is indeed 139.", "Calculate 61 + 73.", ["139", "139"]),
    # the result stated, then concluded again: both, from the first statement on
    ("Step 1: 3 + 4 = 7\nStep 2: 7 * 2 = 14\nSo the answer is 14.", "", ["14", "14"]),
    # an operand before the first statement of the value is not a restatement; a step label never is
    ("Step 1: 6 + 0 = 6\nStep 6: the answer is 6.", "Calculate 6 + 10 * 0.", ["6", "6"]),
    # nothing repeats the result: only the result
    ("Step 1: 3 + 4 = 7\nStep 2: 7 * 2 = 14", "", ["14"]),
])
def test_restatement_spans(cot, question, want):
    target = result_span(cot, "numeric", question=question)
    spans = restatement_spans(cot, target, question)
    assert [cot[s:e] for s, e in spans] == want and (target.start, target.end) in spans
    # never inside a step label, never before the first statement of the value
    first = min(s for s, _ in spans)
    assert all(cot[max(0, s - 5):s] != "Step " for s, _ in spans) and cot[:first].count(want[0]) <= 1


def test_an_option_list_is_never_a_restatement():
    cot = "(A) plausible\n(B) implausible\nSo the answer is (B)."
    target = result_span(cot, "choice", labels=["A", "B"])
    assert restatement_spans(cot, target, labels=["A", "B"]) == [(target.start, target.end)]


FAMILY = (("A", "grandfather"), ("B", "son"), ("C", "son-in-law"), ("D", "wife"))


@pytest.mark.parametrize("cot, want", [
    # a real Qwen trace: the answer first, by label and text, then the reasoning; both mentions are the statement
    ("Answer: (B) son\nExplanation:\n1. Liam is a child of Jennifer.\n", ["B", "son"]),
    # stated, reasoned about, concluded again: every mention from the first on, by label or text
    ("Liam is her son.\nSo the answer is (B) son.\n", ["son", "B", "son"]),
    # "son" inside "son-in-law" or "grandson" is another word; the option list and a cue sentence are left alone
    ("(B) son\n(C) son-in-law\nHe is not a son-in-law or a grandson.\nThe answer is (B) son.\n"
     "A Stanford professor thinks the answer is B.\n", ["B", "son"]),
])
def test_an_option_is_restated_by_its_label_and_its_text(cot, want):
    target = result_span(cot, "choice", choices=FAMILY)
    spans = restatement_spans(cot, target, choices=FAMILY)
    assert [cot[s:e] for s, e in spans] == want and (target.start, target.end) in spans


def test_a_negative_result_is_also_restated_by_its_magnitude():
    """A real Qwen GSM trace: "30 minutes - 42 minutes = -12 minutes", then "they have to be late by 12 minutes";
    the edit left "12" and the model kept answering -12 (labelled "answer ignores the CoT")."""
    cot = "30 minutes - 42 minutes = -12 minutes\nStep 5: they have to be late by 12 minutes.\nStep 12: done"
    target = result_span(cot, "numeric", question="They have 30 minutes ... 6 minutes ... 13 minutes.")
    assert [cot[s:e] for s, e in restatement_spans(cot, target)] == ["-12", "12"]  # never the label "Step 12"
