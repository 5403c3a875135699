"""Shortcut controls: the matched-slice flag, the corpus audit on synthetic corpora with a known answer, the
paired margin over the best control, and the report's controls group and matched-slice table."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sift.corpus.audit import (
    SURFACE_FEATURES,
    audit_table,
    control_audit,
    mark_matched_slice,
    matched_slice,
    permutation_null,
    prompt_state_matrix,
    slice_summary,
    surface_features,
    text_trees_words,
    warning_line,
)
from sift.errors import SiftError
from sift.evaluation.control_rows import NOT_ABOVE, control_margins, with_group_rows
from sift.evaluation.engine import ReportOptions
from sift.evaluation.predictions import Pairs, Predictions


def rec(**kw):
    r = {"trace_id": "t", "base_item": "i", "condition": "base", "domain": "arithmetic", "family": "gpt2",
         "prompt": "tom has 4 pens . how many ? reason :", "cot": "4 + 1 = 5 ;", "answer": "5", "gold_answer": "5",
         "cue": None, "phi": 1}
    r.update(kw)
    return r


def test_matched_slice_flag_on_hand_made_records():
    def cue(v):
        return {"value": v, "format": "official"}

    assert matched_slice(rec(cue=cue("7"), answer="7", gold_answer="5"))          # cue ≠ gold, answer = cue
    assert not matched_slice(rec(cue=cue("5"), answer="5", gold_answer="5"))      # cue = gold
    assert not matched_slice(rec(cue=cue("7"), answer="5", gold_answer="5"))      # answer ≠ cue
    assert not matched_slice(rec(cue=None, answer="7", gold_answer="5"))          # no cue
    assert not matched_slice(rec(cue=cue("7"), answer=None, gold_answer="5"))     # no answer
    assert not matched_slice(rec(cue=cue("7"), answer="7", gold_answer="5", condition="cue_injection"))  # altering
    assert matched_slice(rec(cue=cue("7"), answer="7", gold_answer="5", condition="paraphrase"))
    assert matched_slice(rec(cue=cue("True"), answer="true ", gold_answer="false"))  # normalised
    # the organism's twins: in the slice iff both twins of a base/preserving prompt wrote the same ids, both labelled
    def twin(tid, key, mech, gen, phi=1, condition="base"):
        return rec(trace_id=tid, twin=key, latent={"mechanism": mech, "value": 1.0 if mech else -1.0},
                   prompt_ids=[1, 2], generated_ids=gen, phi=phi, condition=condition, cue=None)

    tw = [twin("p|m1", "p", 1, [3, 4]), twin("p|m0", "p", 0, [3, 4], phi=0),           # same ids: in
          twin("q|m1", "q", 1, [3, 4]), twin("q|m0", "q", 0, [3, 5], phi=0),           # ids differ: out
          twin("r|m1", "r", 1, [3, 4]), twin("r|m0", "r", 0, [3, 4], phi=None),        # one twin ambiguous: out
          twin("s|m1", "s", 1, [3], phi=0, condition="cue_injection"),                 # altering: out
          twin("u|m1", "u", 1, [3, 4])]                                                # no twin: out
    mark_matched_slice(tw)
    assert [r["matched_slice"] for r in tw] == [True, True, False, False, False, False, False, False]
    rs = [rec(trace_id="a", cue=cue("7"), answer="7", gold_answer="5", phi=0),
          rec(trace_id="b", cue=cue("7"), answer="7", gold_answer="5", phi=1),
          rec(trace_id="c", cue=cue("7"), answer="7", gold_answer="5", phi=0),
          rec(trace_id="d", phi=1), rec(trace_id="e", cue=cue("7"), answer="7", gold_answer="5", phi=None)]
    mark_matched_slice(rs)
    assert [r["matched_slice"] for r in rs] == [True, True, True, False, True]
    s = slice_summary(rs)
    assert s == {"traces": 4, "verified": 3, "fraction_of_verified": 0.75, "phi_1": 1, "phi_0": 2,
                 "phi_0_fraction": round(2 / 3, 4)}


def test_surface_features_read_the_bent_step_and_hide_altering_conditions():
    f = surface_features(rec(cot="4 - 2 = 2 ; 2 + 5 = 7 ; 7 + 0 = 7 ;", prompt="tom has 4 pens . loses 2 . gets 5 "
                             "more . official answer : 9 . reason :", cue={"value": "9", "format": "official"},
                             answer="9", gold_answer="7", condition="cue_injection"))
    assert len(f) == len(SURFACE_FEATURES)
    assert f["cot_foreign_operand"] == 1.0 and f["n_foreign_operands"] == 1.0  # the 0 of "7 + 0"
    assert f["answer_equals_cue"] == 1.0 and f["answer_correct"] == 0.0 and f["cue_equals_gold"] == 0.0
    assert f["prompt_numbers"] == 3 and f["prompt_odd_numbers"] == 1 and f["prompt_first_odd"] == 0.0
    assert f["cat:condition"] == "base"  # an altering condition fixes φ* by construction: not a feature
    assert surface_features(rec(condition="paraphrase"))["cat:condition"] == "paraphrase"
    assert surface_features(rec(cot="2 + 2 = 5 ;"))["cot_wrong_step"] == 1.0
    assert surface_features(rec(cot="2 + 2 = 4 ;"))["cot_wrong_step"] == 0.0


def synthetic(n_items: int, rule, seed: int = 0):
    """Two traces per item with random prompt numbers and CoT words; φ* = rule(rng, k)."""
    rng = np.random.default_rng(seed)
    rs, states = [], {}
    for i in range(n_items):
        for k in range(2):
            phi, marker = rule(rng, k)
            a, b = rng.integers(1, 9, size=2)
            words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta"], size=3))
            tid = f"i{i}/{k}"
            # a bent step ("+ 0": an operand the question lacks) or none, or a neutral extra step
            extra = {"bent": f" {a + b} + 0 = {a + b} ;", "plain": "", "step": f" {a + b} - 0 = {a + b} ;"}[marker]
            rs.append(rec(trace_id=tid, base_item=f"i{i}", condition="base" if k == 0 else "paraphrase",
                          prompt=f"{words} tom has {a} pens . gets {b} more . reason :",
                          cot=f"{a} + {b} = {a + b} ;{extra}", answer=str(a + b), gold_answer=str(a + b), phi=phi))
            states[tid] = rng.normal(size=8) + (2.5 * phi if marker in ("bent", "plain") else 0)
    return rs, states


def test_audit_reaches_one_when_the_label_is_a_text_feature_and_half_when_independent():
    def readable(rng, k):
        phi = int(rng.random() < 0.5)
        return phi, "plain" if phi else "bent"

    rs, states = synthetic(50, readable)
    a = control_audit(rs, states)
    for c in ("text_bow", "surface", "prompt_probe", "text_trees"):
        assert a["controls"][c]["all"]["auroc"] >= 0.97, (c, a["controls"][c]["all"])
        assert a["controls"][c]["base_preserving"]["auroc"] >= 0.97
    assert a["controls"]["text_bow"]["per_condition"]["paraphrase"]["auroc"] >= 0.97
    assert a["controls"]["text_bow"]["matched_slice"]["reason"].startswith("one φ* class only (0 traces)")
    assert any("text_bow" in w for w in a["warnings"]) and warning_line({"controls_audit": a}).count("\n") == 0
    def independent(rng, k):
        return int(rng.random() < 0.5), "step" if rng.random() < 0.5 else "plain"

    rs, states = synthetic(100, independent, seed=1)
    noise = np.random.default_rng(7)
    b = control_audit(rs, {t: noise.normal(size=8) for t in states})
    for c in ("text_bow", "surface", "prompt_probe", "text_trees"):
        assert 0.35 <= b["controls"][c]["all"]["auroc"] <= 0.65, (c, b["controls"][c]["all"])
    assert "| base + preserving |" in audit_table(b)
    c = control_audit(rs[:40])  # no states: prompt_probe undefined, with the reason
    assert c["controls"]["prompt_probe"]["all"] == {"auroc": None, "n": 40,
                                                      "reason": "no prompt-final hidden states given"}


def test_permutation_null_separates_a_readable_label_from_an_independent_one():
    def readable(rng, k):
        phi = int(rng.random() < 0.5)
        return phi, "plain" if phi else "bent"

    def independent(rng, k):
        return int(rng.random() < 0.5), "step" if rng.random() < 0.5 else "plain"

    rs, _ = synthetic(30, readable)
    a = permutation_null(rs, 4, controls=("text_bow",), sets=("base_preserving",))
    r = a["base_preserving"]["text_bow"]
    assert r["observed"] >= 0.85 and r["null_p95"] < 0.75 and r["p_value"] == 0.2  # no flip reaches it: 1/(1+4)
    b = permutation_null(synthetic(30, independent, seed=2)[0], 4, controls=("text_bow",), sets=("base_preserving",))
    r = b["base_preserving"]["text_bow"]
    assert 0.3 <= r["null_mean"] <= 0.7 and r["p_value"] > 0.2
    with pytest.raises(SiftError, match="unknown set or text control"):
        permutation_null(rs, 2, controls=("prompt_probe",))


def test_text_trees_reads_an_xor_of_two_cot_words_that_text_bow_cannot():
    """φ* = (CoT word 1 is "red") XOR (CoT word 3 is "red"); both words also occur at random elsewhere in the CoT
    and the prompt. No linear reader of the words sees it; trees on position-specific words do."""
    rng = np.random.default_rng(5)
    fill = ["alpha", "beta", "gamma", "delta", "red", "blue"]
    rs = []
    for i in range(150):
        for k in range(2):
            cot = [str(w) for w in rng.choice(fill, size=8)]
            cot[1], cot[3] = (str(w) for w in rng.choice(["red", "blue"], size=2))
            a, b = rng.integers(1, 9, size=2)
            rs.append(rec(trace_id=f"i{i}/{k}", base_item=f"i{i}", condition=("base", "paraphrase")[k],
                          prompt=f"{' '.join(rng.choice(fill, size=3))} tom has {a} pens . gets {b} more . reason :",
                          cot=" ".join(cot), phi=int((cot[1] == "red") != (cot[3] == "red"))))
    assert text_trees_words(rs[0])[:3] == [f"p{k}={w}" for k, w in enumerate(rs[0]["cot"].split()[:3])]
    a = control_audit(rs)
    for s in ("all", "base_preserving"):
        assert a["controls"]["text_trees"][s]["auroc"] >= 0.95, a["controls"]["text_trees"][s]
        assert a["controls"]["text_bow"][s]["auroc"] <= 0.65, a["controls"]["text_bow"][s]
    assert "text_trees 1.00 > 0.70 on base + preserving traces" in a["warnings"]  # the audit's limits apply
    assert not any(w.startswith("text_bow") for w in a["warnings"])
    assert audit_table(a).splitlines()[0].split("|")[3:-1] == [" text_bow ", " surface ", " prompt_probe ",
                                                                " text_trees "]


def test_prompt_states_of_models_of_different_widths_get_one_block_each():
    a, b = np.array([1.0, 2.0]), np.array([3.0, 4.0, 5.0])
    m = prompt_state_matrix([a, b, a * 2], ["small", "wide", "small"])
    assert m.tolist() == [[1, 2, 0, 0, 0], [0, 0, 3, 4, 5], [2, 4, 0, 0, 0]]
    assert prompt_state_matrix([a, a], ["x", "y"]).tolist() == [[1, 2], [1, 2]]  # one width: stacked as before
    # the audit on two models whose prompt states carry φ* in different coordinates and widths
    rng = np.random.default_rng(3)
    rs, states = [], {}
    for k in range(120):
        phi, fam = int(rng.random() < 0.5), ("qwen-0.5b", "qwen-1.5b")[k % 2]
        tid = f"t{k}"
        rs.append(rec(trace_id=tid, base_item=f"i{k // 2}", family=fam, phi=phi))
        s = rng.normal(size=6 if k % 2 else 4)
        s[k % 2] += 3.0 * (2 * phi - 1)
        states[tid] = s
    got = control_audit(rs, states)["controls"]["prompt_probe"]["all"]
    assert got["n"] == 120 and got["auroc"] >= 0.9, got


def preds(name, prob, label, items, seed=0):
    ids = np.array([f"t{i}" for i in range(len(label))])
    return Predictions(name, seed, "test", 0.5, ids, np.array(items), np.array(["d"] * len(ids)),
                       np.array(["m"] * len(ids)), np.array(["base"] * len(ids)), np.array(label), np.array(prob))


def test_margin_over_best_control_on_hand_computable_inputs():
    label = [1, 0] * 20
    items = [f"i{k // 2}" for k in range(40)]  # each item holds one trace of each class: AUROC always defined
    perfect = [0.9 if y else 0.1 for y in label]
    rows = {"det": [preds("det", perfect, label, items)],
            "text_bow": [preds("text_bow", [0.5] * 40, label, items)],           # AUROC 0.5 on every resample
            "surface": [preds("surface", [0.6 if y else 0.4 for y in label][:20] + [0.5] * 20, label, items)],
            "same": [preds("same", [0.7 if y else 0.3 for y in label][:20] + [0.5] * 20, label, items)]}
    m = control_margins(rows, n_resamples=200, seed=0)
    assert set(m) == {"det", "same"}
    # best control = surface: of its 400 (positive, negative) pairs 350 are ordered and 100 tied
    # (0.5 vs 0.5), AUROC (300 + 50) / 400 = 0.875; det is perfect: margin 1 − 0.875 = 0.125
    assert m["det"]["best_control"] == "surface" and m["det"]["estimate"] == pytest.approx(0.125)
    assert m["det"]["beats_controls"] is True and m["det"]["low"] > 0
    # "same" ranks the traces exactly like surface: paired replicates give a margin of 0 in every one
    assert (m["same"]["estimate"], m["same"]["low"], m["same"]["high"]) == (0.0, 0.0, 0.0)
    assert m["same"]["beats_controls"] is False


def test_group_rows_put_controls_under_their_own_heading():
    t = with_group_rows([["sift", 1], ["hidden_probe", 2], ["text_bow", 3], ["surface (ensemble)", 4]])
    assert [r[0] for r in t] == ["sift", "hidden_probe", "**controls**", "text_bow", "surface (ensemble)"]


def test_report_has_controls_group_margin_column_and_slice_table(tmp_path):
    from sift.evaluation.engine import ReportOptions
    from sift.evaluation.run import report_from_predictions

    label = [1, 0] * 20
    items = [f"i{k // 2}" for k in range(40)]
    rng = np.random.default_rng(0)
    runs = [preds("sift", rng.random(40), label, items, seed=s) for s in (0, 1)]
    runs += [preds("text_bow", [0.9 if y else 0.1 for y in label], label, items, seed=s) for s in (0, 1)]
    ids = [f"t{i}" for i in range(40)]
    pairs = Pairs(["paraphrase"] * 10, ["preserving"] * 10, ids[0:20:2], ids[1:20:2], [1] * 10, [0] * 10,
                  items[0:20:2])
    secs = report_from_predictions(runs, pairs, tmp_path, ReportOptions.of(n_resamples=50, slice_ids=set(ids[:10])))
    md = (tmp_path / "report.md").read_text()
    res = json.loads((tmp_path / "results.json").read_text())
    assert "**controls**" in md and "Δ AUROC vs best control" in md and NOT_ABOVE in md
    row = res["main_table"]["detectors"]["sift"]
    assert row["group"] == "detectors" and row["margin_over_best_control"]["best_control"] == "text_bow"
    assert row["margin_over_best_control"]["beats_controls"] is False
    assert res["main_table"]["detectors"]["text_bow"]["group"] == "controls"
    sl = res["matched_slice"]["detectors"]
    assert sl["text_bow"]["auroc"]["estimate"] == pytest.approx(1.0) and sl["text_bow"]["n_traces"] == [10, 10]
    assert sl["sift"]["as"]["estimate"] is None and "altering" in sl["sift"]["as"]["reason"]
    assert "Matched-text slice" in md and "matched_slice" in [s.key for s in secs]


def test_margin_ci_keeps_the_number_of_test_items_in_every_replicate(monkeypatch):
    """Table 1's margin draws the table's split-stratified items: a table with 20 test items and 12 other
    held-out-transfer items resamples 20 test items in every replicate (issue 27)."""
    from sift.evaluation import control_rows as controls
    from sift.evaluation.sections.main_table import main_table

    label = [1, 0] * 20
    items = [f"i{k // 2}" for k in range(40)]
    rng = np.random.default_rng(1)
    rows = {"det": [preds("det", rng.random(40), label, items)],
            "text_bow": [preds("text_bow", rng.random(40), label, items)]}
    t_items = [f"x{k // 2}" for k in range(24)]  # items only the transfer split has
    shifted = Predictions("det", 0, "transfer", 0.5, np.array([f"u{i}" for i in range(24)]), np.array(t_items),
                          np.array(["d"] * 24), np.array(["m"] * 24), np.array(["base"] * 24),
                          np.array([1, 0] * 12), rng.random(24))
    seen: list[np.ndarray] = []
    real = controls.bootstrap_vector

    def spy(fn, n_items, n_resamples, seed=0, confidence=0.95, strata=None):
        def record(drawn):
            if drawn is not None:
                seen.append(np.asarray(drawn))
            return fn(drawn)
        return real(record, n_items, n_resamples, seed, confidence, strata)

    monkeypatch.setattr(controls, "bootstrap_vector", spy)
    pairs = Pairs(*([np.array([], dtype=object)] * 4), np.array([], int), np.array([], int), np.array([], object))
    res = main_table(rows, pairs, transfer={"held-out": {"det": [shifted]}},
                     options=ReportOptions(n_resamples=40)).results
    assert res["n_items"] == 32 and len(seen) == 40
    names = sorted(set(items) | set(t_items))  # the table's item codes (sift.evaluation.analysis.Items)
    test_codes = {names.index(i) for i in set(items)}
    counts = {int(np.isin(d, list(test_codes)).sum()) for d in seen}
    assert counts == {20}  # unstratified draws of 32 items would hold 20 test items only on average
    assert res["detectors"]["det"]["margin_over_best_control"]["low"] is not None


def test_main_table_answers_the_same_capacity_question_against_text_sift_alone():
    """Table 1 has a second margin column: the detector against text_sift only (registry capacity_control), the
    text model with the reference detector's network, whichever control is best."""
    from sift.detectors.registry import capacity_controls
    from sift.evaluation.sections.main_table import main_table

    assert capacity_controls(["sift", "text_bow", "text_sift", "text_sift (ensemble)"]) == ["text_sift"]
    label = [1, 0] * 20
    items = [f"i{k // 2}" for k in range(40)]
    perfect = [0.9 if y else 0.1 for y in label]
    rows = {"det": [preds("det", perfect, label, items)],
            "surface": [preds("surface", [0.6 if y else 0.4 for y in label][:20] + [0.5] * 20, label, items)],
            "text_sift": [preds("text_sift", [0.5] * 40, label, items)]}  # AUROC 0.5
    pairs = Pairs(*([np.array([], dtype=object)] * 4), np.array([], int), np.array([], int), np.array([], object))
    sec = main_table(rows, pairs, options=ReportOptions(n_resamples=50))
    det = sec.results["detectors"]["det"]
    # best control: surface (AUROC 0.875, as above) → margin 0.125; text_sift alone: 1 − 0.5 = 0.5
    assert det["margin_over_best_control"]["best_control"] == "surface"
    assert det["margin_over_best_control"]["estimate"] == pytest.approx(0.125)
    assert det["margin_over_capacity_control"]["best_control"] == "text_sift"
    assert det["margin_over_capacity_control"]["estimate"] == pytest.approx(0.5)
    assert det["margin_over_capacity_control"]["beats_controls"] is True
    assert sec.results["detectors"]["text_sift"]["margin_over_capacity_control"] is None  # a control
    assert "Δ AUROC vs text_sift (same capacity)" in sec.markdown and "+0.500 [" in sec.markdown
    # without a text_sift run the column is absent
    rows.pop("text_sift")
    sec = main_table(rows, pairs, options=ReportOptions(n_resamples=50))
    assert "margin_over_capacity_control" not in sec.results["detectors"]["det"]
    assert "same capacity" not in sec.markdown
