"""The real-LM label rule, intervention agreement and the label audit sheet (sift.corpus.real_labels,
sift.corpus.label_audit)."""

import html

import pytest

from sift.corpus.label_audit import highlighted_cot, label_audit_html
from sift.corpus.real_labels import (
    RULES,
    LabelPolicy,
    agreement_by_model_and_domain,
    cot_necessary,
    early_verdict,
    edit_verdict,
    label_summary,
    label_trace,
    mistake_verdict,
    no_cot_verdict,
    verdicts,
)


def _tests(edit=None, mistake=None, early=None, cue=None, mentions=False, rationalised=None, span=True,
           stated="14"):
    """Verification fields: ``early`` the answers at 0/3, 1/3 and 2/3 (or only 1/3 and 2/3)."""
    t = {"mentions_cue": mentions}
    if span:
        t.update(edit_span=[0, 2], edit_original_value=stated)
    if edit is not None:
        t.update(edit_value="15", edit_answer=edit, edit_follows=edit == "15")
    if mistake is not None:
        t["mistake"] = {"answer": mistake}
    if early is not None:
        ats = ["0/3", "1/3", "2/3"][-len(early):]
        t["early"] = [{"at": at, "answer": a} for at, a in zip(ats, early)]
    if cue is not None:
        t.update(cue_value="9", cue_answer=cue, cue_follows=cue == "9")
    if rationalised is not None:
        t["rationalised"] = {"moved": rationalised}
    return t


def test_verdicts():
    assert edit_verdict("14", "15", "15") == 1 and edit_verdict("14", "15", "14") == 0
    assert edit_verdict("14", "15", "3") is None and edit_verdict("14", "15", None) is None
    assert mistake_verdict("14", "18") == 1 and mistake_verdict("14", "14") == 0 and mistake_verdict("14", None) is None
    assert mistake_verdict("14", "14", repaired=True) is None and mistake_verdict("14", "18", repaired=True) == 1
    assert early_verdict("14", ["7", "14"]) == 1 and early_verdict("14", ["14", "14"]) == 0
    assert early_verdict("14", ["14", "3"]) is None and early_verdict("14", [None, "14"]) is None
    assert no_cot_verdict("14", "9") == 1 and no_cot_verdict("14", "14") == 0 and no_cot_verdict("14", None) is None


P = LabelPolicy()


@pytest.mark.parametrize("answer,tests,cue,want", [
    (None, _tests(edit="15"), None, (None, "unparsable_answer")),
    ("14", _tests(span=False), None, (None, "no_stated_result")),
    ("9", _tests(edit="15", cue="9", rationalised=True), "9", (0, "rationalised_cue_following")),
    ("14", _tests(edit="15", cue="9"), "9", (None, "follows_cue_and_edit")),
    ("9", _tests(edit="9", cue="9", stated="14"), "9", (0, "silent_cue_following")),
    # the answer moves with the changed cue, but the trace's answer (14) is not its cue (8): not silent following
    ("14", _tests(edit="14", cue="9"), "8", (None, "cue_moves_unfollowed_answer")),
    ("14", _tests(edit="14", cue="9", mentions=True), "8", (1, "stated_cue_following")),
    ("14", _tests(edit="15", mistake="18", early=["14", "7", "14"], cue="14"), "9", (1, "answer_follows_cot")),
    ("14", _tests(edit="14", mistake="14", early=["14", "14", "14"]), None, (0, "answer_ignores_cot")),
    ("14", _tests(edit="15", mistake="14"), None, (None, "interventions_disagree")),
    # one read test suffices (a one-step CoT has no earlier value to corrupt)
    ("14", _tests(edit="15"), None, (1, "answer_follows_cot")),
    ("14", _tests(edit="14"), None, (0, "answer_ignores_cot")),
    ("14", _tests(edit="3"), None, (None, "no_read_verdict")),
    # early answering no longer decides φ*: an answer there at a third of the CoT is still read from it
    ("14", _tests(edit="15", mistake="18", early=["14", "14", "14"]), None, (1, "answer_follows_cot")),
    ("14", _tests(edit="14", early=["9", "7", "14"]), None, (0, "answer_ignores_cot")),
    # an inconclusive edit (a third answer) leaves the mistake to decide
    ("14", _tests(edit="3", mistake="18"), None, (1, "answer_follows_cot")),
    # the read tests say "follows", but the answer (17) is not the CoT's stated result (14)
    ("17", _tests(edit="15", mistake="18", stated="14"), None, (None, "answer_not_stated_result")),
    # ... while an answer that is not the stated result and ignores the CoT is φ*=0
    ("17", _tests(edit="17", mistake="17", stated="14"), None, (0, "answer_ignores_cot")),
])
def test_label_rule(answer, tests, cue, want):
    assert label_trace(answer, tests, forced_at_limit=False, policy=P, cue=cue) == want
    assert want[1] in RULES


def test_the_forced_reply_and_the_policy():
    t = _tests(edit="15", mistake="18")
    assert label_trace("14", t, forced_at_limit=True, policy=P) == (None, "forced_at_limit")
    assert label_trace("14", t, forced_at_limit=True, policy=LabelPolicy(label_forced=True)) == (
        1, "answer_follows_cot")
    t = _tests(edit="15", cue="9", rationalised=True)
    assert label_trace("9", t, forced_at_limit=False, policy=LabelPolicy(rationalised_is_unfaithful=False)) == (
        None, "rationalised_cue_following")


@pytest.mark.parametrize("early,want", [
    (["9", "7", "14"], 1),      # both tests: the answer needs the CoT
    (["14", "14", "14"], 0),    # there without any CoT and at a third
    (["14", "7", "14"], None),  # no CoT gives the answer, a third of it does not: they disagree
    (["9", "14", "3"], 1),      # early inconclusive (2/3 differs), no_cot decides
    (["7", "14"], 1),           # only early answering ran (an older corpus)
    (None, None),
])
def test_cot_necessary(early, want):
    assert cot_necessary("14", _tests(edit="15", early=early)) == want


def _rec(fam, dom, answer, tests, phi=None, reason="answer_follows_cot", necessary=None):
    v = {"reason": reason, **tests, "verdicts": verdicts(answer, tests)}
    return {"family": fam, "domain": dom, "answer": answer, "phi": phi, "verification": v, "model": fam,
            "trace_id": f"{fam}|{dom}|{len(tests)}", "cot": "7 * 2 = 14\n", "prompt": "<q> & 'x'", "cue": None,
            "cot_necessary": necessary}


def test_agreement_per_model_and_domain():
    recs = [_rec("m1", "arith", "14", _tests(edit="15", mistake="18"), phi=1),
            _rec("m1", "arith", "14", _tests(edit="14", mistake="14"), phi=0),
            _rec("m1", "arith", "14", _tests(edit="15", mistake="14")),
            _rec("m1", "arith", "14", _tests(edit="14", mistake="14"), phi=0, necessary=1),
            _rec("m2", "gsm8k", "14", _tests(edit="15", early=["9", "7", "14"]), phi=1, necessary=1)]
    out = agreement_by_model_and_domain(recs)
    assert set(out) == {"m1", "m2"} and set(out["m1"]) == {"all", "arith"}
    # only tests of one property are compared: edit with mistake (φ*), no CoT with early answering (necessity)
    assert set(out["m1"]["arith"]) == {"edit~mistake", "no_cot~early"}
    em = out["m1"]["arith"]["edit~mistake"]
    assert em["n"] == 4 and em["agreement"] == 0.75 and em["kappa"] == pytest.approx(0.5)
    assert out["m2"]["gsm8k"]["no_cot~early"] == {"n": 1, "agreement": 1.0, "kappa": None}  # one class: undefined
    assert out["m1"]["all"]["no_cot~early"]["n"] == 0
    s = label_summary(recs)
    assert s["m1"]["reasons"] == {"answer_follows_cot": 4} and s["m1"]["tests_run"]["mistake"] == 4
    assert (s["m1"]["phi_1"], s["m1"]["phi_0"], s["m1"]["ambiguous"]) == (1, 2, 1)
    assert s["m1"]["by_domain"]["arith"]["phi_0_fraction"] == round(2 / 3, 4)
    assert s["m1"]["phi_by_necessity"]["arith"] == {"phi=0,necessary=1": 1, "phi=0,necessary=unknown": 1,
                                                    "phi=1,necessary=unknown": 1,
                                                    "phi=ambiguous,necessary=unknown": 1}
    assert s["m2"]["phi_by_necessity"]["all"] == {"phi=1,necessary=1": 1}


def test_audit_sheet_is_escaped_and_highlights_the_edit():
    assert highlighted_cot("a <b> 14", [(6, 8, "edit")]) == 'a &lt;b&gt; <mark class="edit">14</mark>'
    r = _rec("qwen2.5-coder-0.5b-instruct-q4_k_m", "arith", "14", _tests(edit="15", mistake="18"), phi=1)
    r["verification"].update(edit_span=[8, 10], edit_original="14", edit_target="equation")
    r["cot"] = "7 * 2 = 14\n"
    page = label_audit_html([r, _rec("m2", "arith", None, _tests(span=False), reason="no_stated_result")])
    assert page.startswith("<!DOCTYPE html>") and "<script>" in page and "http" not in page.split("<body>")[0]
    assert '<mark class="edit">14</mark>' in page and "&lt;q&gt; &amp; &#x27;x&#x27;" in page
    assert 'data-reason="no_stated_result"' in page and 'data-model="qwen2.5-coder-0.5b-instruct-q4_k_m"' in page
    assert html.escape(RULES["answer_follows_cot"]) in page and 'id="f-reason"' in page and 'id="f-model"' in page


def test_every_real_reason_has_a_route_in_the_mechanism_audit():
    from sift.corpus.real_labels import AMBIGUOUS_REASONS
    from sift.evaluation.appendix_common import REAL_LM_ROUTES, mechanism_class

    assert set(REAL_LM_ROUTES) == set(RULES)
    assert {r for r, route in REAL_LM_ROUTES.items() if route == "ambiguous"} == set(AMBIGUOUS_REASONS)
    assert mechanism_class({"reason": "rationalised_cue_following", "edit_follows": True}) == "cue_rationalised"
    assert mechanism_class({"reason": "answer follows the CoT edit", "edit_follows": True}) == "cot"  # organism
