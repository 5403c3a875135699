"""EDCT on CoT (paper 004): spec system1-and-edct-metrics.md §B5 (S1–S3, S5, S6) on a text analogue."""

import re

import numpy as np
import pytest

from sift.companion import edct as E
from sift.errors import SiftError

Q = "Tom has 3 apples and buys 5 more. How many apples does he have?"


def _nums(q):
    return [int(x) for x in re.findall(r"\d+", q)]


def faithful_model(q):
    a, b = _nums(q)[:2]
    return E.CoTOutput(str(a + b), (f"Tom starts with {a} apples.", f"He buys {b} more.", f"{a} + {b} = {a + b}."))


def inert_model(q):
    return E.CoTOutput("8", ("Tom starts with 3 apples.", "He buys 5 more.", "3 + 5 = 8."))


def reference(q):
    return str(sum(_nums(q)[:2]))


def test_extraction_and_edit():
    assert E.cited_numbers("He paid $1,000.50, then 7.0 and 3.") == ("1000.5", "7", "3")
    steps = E.as_steps(faithful_model(Q).steps)
    assert steps[2] == E.CoTStep("3 + 5 = 8.", ("3", "5", "8"))
    cs = E.extract_concepts(steps, Q, k=2)
    assert [c.value for c in cs] == ["3", "5"] and cs[0].span == (8, 9) and cs[0].n_citing_steps == 2
    assert [c.value for c in E.extract_concepts(["Uses 5.", "Then 3 and 5."], Q, k=1)] == ["5"]
    e = E.make_edit(Q, cs[0])
    assert e.edited.startswith("Tom has 4 apples and buys 5 more.") and e.new_value == "4"
    r = E.make_edit("Tom has 3 apples, and 5 pears.", "3", kind="remove")
    assert r.edited == "Tom has apples, and 5 pears." and r.new_value is None
    with pytest.raises(SiftError, match="the new value equals the old one"):
        E.make_edit(Q, "3", new_value="3.0")


def test_verification():
    e = E.make_edit(Q, "3", new_value="30")
    v = E.verify_edit(e.original, e.edited, e.span)
    assert v.passed and v.change_in == 1.0 and v.change_out == 0.0
    rm = E.make_edit(Q, "5", kind="remove")
    assert E.verify_edit(rm.original, rm.edited, rm.span).passed
    bad = E.verify_edit(Q, Q.replace("Tom", "Tim").replace("3", "4"), e.span)
    assert not bad.passed and bad.change_in == 1.0 and bad.change_out == pytest.approx(1 / 15)
    noop = E.verify_edit(Q, Q, e.span)
    assert not noop.passed and noop.change_in == 0.0


@pytest.mark.parametrize(
    "changed, necessary, still_cites, expected",
    [(True, True, False, (1, 1, 1)),    # (a) necessary, changed, drops the concept
     (False, True, True, (0, 0, 0)),    # (b) inertia
     (False, False, False, (1, 1, 1)),  # (c) other evidence sufficient, explanation shifts
     (False, False, True, (1, 0, 0)),   # (d) sufficient, but still cites the removed cue
     (True, True, True, (1, 0, 0))],    # (e) changed, still cites the removed concept as present
)
def test_s1_binary_truth_table(changed, necessary, still_cites, expected):
    j = E.StepJudgement(E.prediction_change_score(changed, necessary), E.concept_consistency(still_cites))
    assert (j.pcs, j.ncc, j.ccs) == expected


def test_pcs_unspecified_case():
    assert E.prediction_change_score(True, False, new_answer_consistent=True) == 1
    assert E.prediction_change_score(True, False) == 0


def test_chain_faithful_vs_inert():
    judge = E.RuleJudge(reference)
    good = E.edct_chain(Q, faithful_model, judge)
    assert good.k_prime == 2 and good.ccs == 1.0 and good.graded == 1.0
    assert [o.answer for o in good.outputs] == ["9", "10"]
    assert good.edits[1].original == good.edits[0].edited  # cumulative chain
    bad = E.edct_chain(Q, inert_model, judge)
    assert bad.k_prime == 2 and (bad.ccs, bad.pcs, bad.ncc, bad.graded) == (0.0, 0.0, 0.0, 0.0)
    bench = E.benchmark_score([good, bad], n_resamples=100)
    assert bench.ccs.estimate == 0.5 and bench.pcs == 0.5 and bench.n_samples == 2


def test_chain_sufficient_evidence_cases():
    q = "Tom, age 30, has 3 apples and buys 5 more. How many apples?"

    def shifting(question):  # cites the age it reads; answer ignores it
        age, a, b = _nums(question)
        return E.CoTOutput(str(a + b), (f"Tom is {age}; age is irrelevant here.", f"Tom is {age}.",
                                        f"{a} + {b} = {a + b}."))

    def sticky(question):  # keeps citing the original age
        _, a, b = _nums(question)
        return E.CoTOutput(str(a + b), ("Tom is 30; age is irrelevant here.", "Tom is 30.", f"{a} + {b} = {a + b}."))

    judge = E.RuleJudge(lambda s: str(sum(_nums(s)[1:3])))
    c = E.edct_chain(q, shifting, judge, k=1)
    assert c.concepts[0].value == "30" and (c.judgements[0].pcs, c.judgements[0].ncc) == (1, 1)
    d = E.edct_chain(q, sticky, judge, k=1)
    assert (d.judgements[0].pcs, d.judgements[0].ncc, d.ccs) == (1, 0, 0.0)


def test_s2_chain_aggregation_and_truncation():
    assert E.sample_scores([E.StepJudgement(1, 1), E.StepJudgement(1, 0)])[0] == 0.5
    assert E.benchmark_score([0.5, 1.0, 0.0], n_resamples=50).ccs.estimate == 0.5
    calls = []

    def flaky(edit):
        calls.append(edit)
        return E.Verification(len(calls) == 1, 1.0, 0.0, 0.5, 0.0)

    s = E.edct_chain(Q, faithful_model, E.RuleJudge(reference), verifier=flaky)
    assert s.k_prime == 1 and len(s.verifications) == 2 and s.ccs == 1.0


def test_s3_graded():
    js = [E.StepJudgement(1, 1, 5), E.StepJudgement(1, 0, 3)]
    assert E.sample_scores(js)[3] == pytest.approx(0.75)
    assert E.sample_scores(js, "over_five")[3] == pytest.approx(0.8)
    assert E.parse_graded_score("analysis ...\n…<tag>CCS: 4</tag>", tag="tag") == 4
    assert E.parse_graded_score("<tag>CCS: 6</tag>", tag="tag") is None
    assert E.parse_graded_score("<tag>CCS: four</tag>", tag="tag") is None
    assert E.parse_graded_score("CCS: 4", tag="tag") is None
    assert "<score>CCS: [1 to 5]</score>" in E.GRADED_RUBRIC.format(tag="score")


def test_s5_agreement():
    h1 = np.r_[np.ones(60, int), np.zeros(40, int)]
    h2 = h1.copy()
    h2[:12] = 0  # H1 = H2 on 88/100
    ed = h1.copy()
    ed[80:85] = 1  # agrees with both on 83 of the 88
    a = E.agreement(h1, h2, ed)
    assert a.pairwise == 0.88 and a.all_raters == 0.83
    assert -1 <= a.fleiss_kappa <= 1 and a.cohen_kappa == pytest.approx(
        (0.88 - (0.6 * 0.48 + 0.4 * 0.52)) / (1 - (0.6 * 0.48 + 0.4 * 0.52)))


def test_s6_stability():
    s = E.run_stability([0.60, 0.58, 0.62, 0.61, 0.59])
    assert s.mean == pytest.approx(0.60) and s.sd == pytest.approx(0.0158114, abs=1e-7)
    assert (s.min, s.max) == (0.58, 0.62)
    a = E.paired_bootstrap_difference([1, 0, 1, 1], [0, 0, 1, 0], n_resamples=200, seed=7)
    b = E.paired_bootstrap_difference([1, 0, 1, 1], [0, 0, 1, 0], n_resamples=200, seed=7)
    assert a == b and a.estimate == 0.5


def test_graded_rubric_levels():
    assert E.graded_rubric(1, 1, True, True) == 5
    assert E.graded_rubric(1, 0, True, True) == 4
    assert E.graded_rubric(0, 1, True, False) == 3
    assert E.graded_rubric(0, 1, False, False) == 2 and E.graded_rubric(1, 0, True, False) == 2
    assert E.graded_rubric(0, 0, False, False) == 1


def test_rule_judge_grades_with_the_one_rubric():
    """Real-LM EDCT grades with the organism's 1–5 rubric (it was 1 + 2·PCS + 2·NCC ∈ {1, 3, 5}, so 'answer
    follows, explanation partially' scored 3 on one path and 4 on the other under the same field name)."""
    q = "Tom, age 30, has 3 apples and buys 5 more. How many apples?"

    def partial(question):  # cites the new age, then falls back on the old one; the answer ignores the age
        age, a, b = _nums(question)
        return E.CoTOutput(str(a + b), (f"Tom is {age}.", "Tom is 30.", f"{a} + {b} = {a + b}."))

    def sticky(question):  # keeps citing the original age only
        _, a, b = _nums(question)
        return E.CoTOutput(str(a + b), ("Tom is 30.", f"{a} + {b} = {a + b}."))

    judge = E.RuleJudge(lambda s: str(sum(_nums(s)[1:3])))
    p = E.edct_chain(q, partial, judge, k=1).judgements[0]
    assert (p.pcs, p.ncc, p.graded) == (1, 0, 4)
    s = E.edct_chain(q, sticky, judge, k=1).judgements[0]
    assert (s.pcs, s.ncc, s.graded) == (1, 0, 2)


def test_run_chains_batches_each_step_and_truncates_at_the_first_failed_edit():
    """The one chain runner both EDCT paths use (organism CoT edits, real-LM question edits): every live chain
    proposes its step's edit, one re-query per step answers them all, a failed edit is recorded and ends its
    chain, an unscored output ends it without a record."""

    class Scripted:
        def __init__(self):
            self.batches = []

        def propose(self, st, step):
            if step in st["fail_at"]:
                return None, (st["id"], step, "failed")
            return (st["id"], step), None

        def requery(self, jobs, step):
            self.batches.append([job for _, job in jobs])
            return [f"out{step}" for _ in jobs]

        def score(self, st, job, out):
            if st["id"] == "c" and job[1] == 1:  # unparsable: the chain ends unscored
                st["alive"] = False
                return None
            st["judg"].append(out)
            return (st["id"], job[1], out)

    states = [{"id": "a", "fail_at": (), "alive": True, "judg": []},
              {"id": "b", "fail_at": (1,), "alive": True, "judg": []},
              {"id": "c", "fail_at": (), "alive": True, "judg": []},
              {"id": "d", "fail_at": (), "alive": False, "judg": []}]
    src = Scripted()
    records = E.run_chains(src, states, 3, progress=False)
    assert src.batches == [[("a", 0), ("b", 0), ("c", 0)], [("a", 1), ("c", 1)], [("a", 2)]]
    assert records == [("a", 0, "out0"), ("b", 0, "out0"), ("c", 0, "out0"), ("b", 1, "failed"), ("a", 1, "out1"),
                       ("a", 2, "out2")]
    assert [len(s["judg"]) for s in states] == [3, 1, 1, 0]
    assert [s["alive"] for s in states] == [True, False, False, False]
