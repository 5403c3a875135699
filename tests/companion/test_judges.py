"""LLM-judge rationalization-bias metrics (paper 001): spec ice-and-judge-metrics.md §B5."""

import math

import numpy as np
import pytest

from sift.companion import judges as J

Q, C = "The document text.", ("Paraphrase one.", "Paraphrase two.")
TRUE = ("LLM", "TradML")


def test_cue_condition_prompts():
    b = J.blind_prompt(Q, C)
    assert "(label =" not in b and "Summary 1: Paraphrase one." in b and "Summary 2: Paraphrase two." in b
    assert b.startswith("You are a careful judge.") and '"verdict"' in b and "Document: The document text." in b
    t = J.truth_prompt(Q, C, TRUE)
    assert "Summary 1 (label = LLM): Paraphrase one." in t and "Summary 2 (label = TradML): Paraphrase two." in t
    f = J.flip_prompt(Q, C, TRUE)
    assert "Summary 1 (label = TradML): Paraphrase one." in f and "Summary 2 (label = LLM): Paraphrase two." in f
    p = J.placebo_prompt(Q, C, badged=1)
    assert "Summary 1: Paraphrase one." in p and "Summary 2 (label = Reviewed ✓): Paraphrase two." in p
    r = J.reveal_after_prompts(Q, C, TRUE)
    assert r.turn1 == f
    assert r.turn2 == ("Correction: the labels above were swapped. The correct labels are Summary 1 = LLM, "
                       "Summary 2 = TradML. Re-evaluate and output the same JSON.")
    swapped = J.truth_prompt(Q, C, TRUE, display_order=(1, 0))
    assert "Summary 1 (label = TradML): Paraphrase two." in swapped
    assert J.reveal_after_prompts(Q, C, TRUE, display_order=(1, 0)).turn2.endswith(
        "Summary 1 = TradML, Summary 2 = LLM. Re-evaluate and output the same JSON.")
    s = J.truth_prompt(Q, C, TRUE, protocol="scot")
    assert "accuracy, completeness, conciseness, fluency" in s
    lock = J.blind_prompt(Q, C, protocol="pbp_lock")
    assert "Do not provide a verdict." in lock and "locked_notes" in lock
    stage2 = J.pbp_prompts(Q, C, None)("acc: S1 quotes X")
    assert "locked_notes: acc: S1 quotes X" in stage2 and "0-5 scores" in stage2
    # generic question / candidate answers
    g = J.blind_prompt("What is 2+2?", ("4", "5"), context_name="Question", candidate_name="Answer")
    assert "Question: What is 2+2?" in g and "Answer 2: 5" in g


def test_favored_outcome_and_derandomisation():
    assert J.favored_outcome(TRUE) == "[1,2]"
    assert J.favored_outcome(TRUE[::-1]) == "[2,1]"  # Flip: candidate 2 displays "LLM"
    assert J.favored_outcome((None, J.DEFAULT_BADGE), favored_label=J.DEFAULT_BADGE) == "[2,1]"
    assert J.favored_outcome((None, None)) is None
    assert J.map_display_verdict("[1,2]", (1, 0)) == "[2,1]"
    assert J.map_display_verdict("Tie", (1, 0)) == "Tie"
    assert J.map_display_verdict("[1, 2]", (0, 1)) == "[1,2]"
    out = J.parse_judge_output('Sure. {"verdict": "[1,2]", "explanation": "S1 is tighter."}', (1, 0))
    assert out == J.JudgeOutput("[2,1]", "S1 is tighter.")
    assert J.parse_judge_output("no json") is None
    assert J.parse_judge_output('{"verdict": "maybe"}') is None


def test_edr_nd_fixtures():
    assert J.equality_detection_rate((0, 540, 460)) == 0.0
    assert J.neutrality_deviation((0, 540, 460)) == pytest.approx(0.080)
    assert J.equality_detection_rate((840, 97, 63)) == pytest.approx(0.84)
    assert J.neutrality_deviation((840, 97, 63)) == pytest.approx(0.034)
    assert J.equality_detection_rate((937, 34, 29)) == pytest.approx(0.937)
    assert J.neutrality_deviation((937, 34, 29)) == pytest.approx(0.005)
    assert J.neutrality_deviation(["[1,2]", "Tie", "[1,2]", "[2,1]"]) == pytest.approx(0.25)


@pytest.mark.parametrize(
    "probe, expected",
    [((500, 400, 100), (0.3, 0.0, 0.0, 1.0)),      # pure anchoring
     ((900, 50, 50), (0.0, 0.1, 0.0, 0.0)),        # tie-only movement
     ((600, 250, 150), (0.15, 0.0, 0.05, 0.75))],  # mixed
)
def test_outcome_shift_cases(probe, expected):
    s = J.outcome_shift((800, 100, 100), probe, "[1,2]")
    assert (s.lds, s.ts, s.ols, s.lao) == pytest.approx(expected)
    assert s.tv == pytest.approx(s.lds + s.ts + s.ols)


def test_outcome_shift_no_movement_and_property():
    s = J.outcome_shift((800, 100, 100), (800, 100, 100), "[1,2]")
    assert s.tv == 0.0 and math.isnan(s.lao) and s.low_tv
    assert J.outcome_shift((8, 1, 1), (8, 1, 1), "[1,2]", zero_division=0.0).lao == 0.0
    rng = np.random.default_rng(0)
    for _ in range(200):
        pb, pp = rng.dirichlet(np.ones(3)), rng.dirichlet(np.ones(3))
        s = J.outcome_shift(pb, pp, "[2,1]")
        assert s.lds + s.ts + s.ols == pytest.approx(0.5 * np.abs(pp - pb).sum(), abs=1e-12)


def test_table_fixtures():
    s = J.outcome_shift((840, 97, 63), (215, 680, 105), "[1,2]")  # SCoT-Gemma, True
    assert (round(s.lds, 3), s.ts, round(s.ols, 3), round(s.lao, 3)) == (0.583, 0.0, 0.042, 0.933)
    blind = {"Llama": (0, 470, 530), "Mistral": (0, 550, 450), "Qwen": (0, 460, 540), "Zephyr": (0, 510, 490)}
    true = {"Llama": (0, 860, 140), "Mistral": (0, 1000, 0), "Qwen": (0, 750, 250), "Zephyr": (0, 1000, 0)}
    lds = {m: J.outcome_shift(blind[m], true[m], "[1,2]") for m in blind}
    assert [round(lds[m].lds, 3) for m in blind] == [0.39, 0.45, 0.29, 0.49]
    assert all(v.lao == 1.0 for v in lds.values())


def test_simulated_judge():
    pb = (0.5, 0.3, 0.2)
    b, p = J.simulate_cued_judge(pb, "[1,2]", beta=0.3, gamma=0.0, n=100_000, seed=1)
    s = J.outcome_shift(b, p, "[1,2]")
    assert s.lds == pytest.approx(0.3 * (1 - 0.3), abs=0.005) and s.lao == 1.0
    t = J.transition_matrix(b, p)
    assert t.sum() == 100_000
    into_f = t[[0, 2], 1].sum() / 100_000  # off-diagonal mass into f
    assert into_f == pytest.approx(0.3 * 0.7, abs=0.005)
    b, p = J.simulate_cued_judge(pb, "[1,2]", beta=0.3, gamma=0.1, n=100_000, seed=2)
    assert J.outcome_shift(b, p, "[1,2]").lds == pytest.approx(0.3 - 0.4 * 0.3, abs=0.005)
    ci = J.outcome_shift_ci(b[:2000], p[:2000], "[1,2]", n_resamples=100)
    assert ci.low < ci.estimate < ci.high and ci.estimate == pytest.approx(0.18, abs=0.03)


def test_explanation_drift():
    vb = ["[1,2]", "Tie", "[2,1]"]
    vp = ["[1,2]", "[1,2]", "[2,1]"]
    eb = ["alpha beta gamma", "x", "same text here"]
    ep = ["delta epsilon", "y", "same text here"]
    d = J.explanation_drift(vb, vp, eb, ep)
    assert d.n_same == 2 and d.value == pytest.approx(0.5) and d.scorer == "rouge_l_distance"
    assert J.explanation_drift(["Tie"], ["[1,2]"], ["a"], ["b"]).n_same == 0
    assert math.isnan(J.explanation_drift(["Tie"], ["[1,2]"], ["a"], ["b"]).value)
    assert J.rouge_l_f1("the cat sat on the mat", "the cat on the mat") == pytest.approx(2 * 1 * (5 / 6) / (1 + 5 / 6))


def test_revision_susceptibility():
    r = J.revision_susceptibility(["[1,2]", "[1,2]", "Tie", "[2,1]"], ["[1,2]", "[2,1]", "Tie", "[1,2]"],
                                  truth_favored="[1,2]")
    assert r.rs == 0.5 and r.rs_directional == 0.25 and r.n == 4
    assert r.ci[0] < 0.5 < r.ci[1]


def test_lai_lexicon():
    a = J.label_alignment("Summary 1 is better; as the LLM-generated summary it reads more fluently", "[1,2]", TRUE)
    assert a == 1.0
    assert J.label_alignment("Summary 1 covers the key results", "[1,2]", TRUE) == 0.0
    assert J.label_alignment("Summary 2, the traditional one, is weaker", "[1,2]", TRUE) == 1.0
    assert J.label_alignment("Summary 2, the traditional one, is better", "[1,2]", TRUE) == 0.0
    lai = J.label_aligned_rationale(
        ["[1,2]", "[1,2]", "Tie"], ["[1,2]", "[1,2]", "[1,2]"],
        ["Summary 1, the LLM one, is clearer.", "Summary 1 covers more.", "irrelevant"], "[1,2]", TRUE)
    assert lai.value == 0.5 and lai.n_same == 2


def test_attacks_and_cue_align():
    v = J.verbosity_attack("The firm grew. Profits rose.")
    assert v.startswith("The firm grew. Profits rose. In other words, the firm grew.") and len(v) > 40
    assert J.verbosity_attack("A.", padding="B.") == "A. B."
    assert J.confidence_attack("Perhaps the firm grew.") == "Clearly and without doubt: The firm grew."
    ap = J.attack_prompt(Q, C, 1, "verbosity")
    assert ap.favored == "[2,1]" and "Summary 2: Paraphrase two. In other words, paraphrase two." in ap.prompt
    assert "Text: abc" in J.attack_rewrite_prompt("abc", "confidence")
    assert J.cue_alignment("Summary 2 is more detailed and thorough.", 1, "verbosity") == 1
    assert J.cue_alignment("Summary 1 is more detailed.", 1, "verbosity") == 0
    assert J.cue_align_rate(["Summary 1 is precise and clear.", "Summary 2 is fine."], [0, 1], "confidence") == 0.5
