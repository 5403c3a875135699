"""The real-LM label rule, intervention agreement and the label audit sheet (sift.corpus.real_labels,
sift.corpus.label_audit)."""

import pytest

from sift.corpus.label_audit import highlighted_cot, label_audit_html
from sift.corpus.real_labels import (
    RULES,
    LabelPolicy,
    agreement_by_model_and_domain,
    early_verdict,
    edit_verdict,
    label_summary,
    label_trace,
    mistake_verdict,
    verdicts,
)


def _tests(edit=None, mistake=None, early=None, cue=None, mentions=False, rationalised=None, span=True):
    t = {"mentions_cue": mentions}
    if span:
        t["edit_span"] = [0, 2]
    if edit is not None:
        t.update(edit_value="15", edit_answer=edit, edit_follows=edit == "15")
    if mistake is not None:
        t["mistake"] = {"answer": mistake}
    if early is not None:
        t["early"] = [{"answer": a} for a in early]
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


P = LabelPolicy()


@pytest.mark.parametrize("answer,tests,forced,want", [
    (None, _tests(edit="15"), False, (None, "unparsable_answer")),
    ("14", _tests(edit="15", mistake="18"), True, (None, "forced_at_limit")),
    ("14", _tests(span=False), False, (None, "no_stated_result")),
    ("14", _tests(edit="15", cue="9", rationalised=True), False, (0, "rationalised_cue_following")),
    ("14", _tests(edit="15", cue="9"), False, (None, "follows_cue_and_edit")),
    ("14", _tests(edit="14", cue="9"), False, (0, "silent_cue_following")),
    ("14", _tests(edit="14", cue="9", mentions=True), False, (1, "stated_cue_following")),
    ("14", _tests(edit="15", mistake="18", early=["7", "14"], cue="14"), False, (1, "cot_load_bearing")),
    ("14", _tests(edit="14", mistake="14", early=["14", "14"]), False, (0, "cot_not_load_bearing")),
    ("14", _tests(edit="15", mistake="14"), False, (None, "interventions_disagree")),
    ("14", _tests(edit="15"), False, (None, "too_few_verdicts")),
    # an inconclusive edit (a third answer) leaves mistake and early to agree
    ("14", _tests(edit="3", mistake="18", early=["7", "14"]), False, (1, "cot_load_bearing")),
])
def test_label_rule(answer, tests, forced, want):
    assert label_trace(answer, tests, forced_at_limit=forced, policy=P) == want
    assert want[1] in RULES


def test_label_policy():
    t = _tests(edit="15", mistake="18")
    assert label_trace("14", t, forced_at_limit=True, policy=LabelPolicy(label_forced=True)) == (1, "cot_load_bearing")
    t = _tests(edit="15", cue="9", rationalised=True)
    assert label_trace("14", t, forced_at_limit=False, policy=LabelPolicy(rationalised_is_unfaithful=False)) == (
        None, "rationalised_cue_following")


def _rec(fam, dom, answer, tests, phi=None, reason="cot_load_bearing"):
    v = {"reason": reason, **tests, "verdicts": verdicts(answer, tests)}
    return {"family": fam, "domain": dom, "answer": answer, "phi": phi, "verification": v, "model": fam,
            "trace_id": f"{fam}|{dom}|{len(tests)}", "cot": "7 * 2 = 14\n", "prompt": "<q> & 'x'", "cue": None}


def test_agreement_per_model_and_domain():
    recs = [_rec("m1", "arith", "14", _tests(edit="15", mistake="18")),
            _rec("m1", "arith", "14", _tests(edit="14", mistake="14")),
            _rec("m1", "arith", "14", _tests(edit="15", mistake="14")),
            _rec("m1", "arith", "14", _tests(edit="14", mistake="14")),
            _rec("m2", "gsm8k", "14", _tests(edit="15", early=["7", "14"]))]
    out = agreement_by_model_and_domain(recs)
    assert set(out) == {"m1", "m2"} and set(out["m1"]) == {"all", "arith"}
    em = out["m1"]["arith"]["edit~mistake"]
    assert em["n"] == 4 and em["agreement"] == 0.75 and em["kappa"] == pytest.approx(0.5)
    assert out["m2"]["gsm8k"]["edit~early"] == {"n": 1, "agreement": 1.0, "kappa": None}  # one class: undefined
    assert out["m1"]["all"]["edit~cue"]["n"] == 0
    s = label_summary(recs)
    assert s["m1"]["reasons"] == {"cot_load_bearing": 4} and s["m1"]["tests_run"]["mistake"] == 4


def test_audit_sheet_is_escaped_and_highlights_the_edit():
    assert highlighted_cot("a <b> 14", [(6, 8, "edit")]) == 'a &lt;b&gt; <mark class="edit">14</mark>'
    r = _rec("qwen2.5-coder-0.5b-instruct-q4_k_m", "arith", "14", _tests(edit="15", mistake="18"), phi=1)
    r["verification"].update(edit_span=[8, 10], edit_original="14", edit_target="equation")
    r["cot"] = "7 * 2 = 14\n"
    page = label_audit_html([r, _rec("m2", "arith", None, _tests(span=False), reason="no_stated_result")])
    assert page.startswith("<!DOCTYPE html>") and "<script>" in page and "http" not in page.split("<body>")[0]
    assert '<mark class="edit">14</mark>' in page and "&lt;q&gt; &amp; &#x27;x&#x27;" in page
    assert 'data-reason="no_stated_result"' in page and 'data-model="qwen2.5-coder-0.5b-instruct-q4_k_m"' in page
    assert RULES["cot_load_bearing"] in page and 'id="f-reason"' in page and 'id="f-model"' in page


def test_every_real_reason_has_a_route_in_the_mechanism_audit():
    from sift.corpus.real_labels import AMBIGUOUS_REASONS
    from sift.evaluation.appendix_common import REAL_LM_ROUTES, mechanism_class

    assert set(REAL_LM_ROUTES) == set(RULES)
    assert {r for r, route in REAL_LM_ROUTES.items() if route == "ambiguous"} == set(AMBIGUOUS_REASONS)
    assert mechanism_class({"reason": "rationalised_cue_following", "edit_follows": True}) == "cue_rationalised"
    assert mechanism_class({"reason": "answer follows the CoT edit", "edit_follows": True}) == "cot"  # organism
