"""Appendix analyses (sift.evaluation.appendix*) on small hand-built predictions and pairs.

The toy split: four base items i0..i3, each with a base trace (φ* = 1), a paraphrase (φ* = 1; a preserving
pair with the base) and a cue-injected trace (φ* = 0; an altering pair 1 → 0 with the base). Probabilities
0.9 / 0.1 make the verdicts explicit; a "violation" of pair k gives the paraphrase of item k probability 0.2.
"""

import json
import math

import numpy as np
import pytest

from sift.evaluation.appendix import (
    APPENDIX_ANALYSES,
    TraceTable,
    abstention_characterisation,
    factorial_decomposition,
    label_noise_sensitivity,
    mechanism_class,
    mechanism_preservation_audit,
    optimal_coverage,
    pair_features,
    run_appendix,
    spurious_feature_correlations,
    stability_sensitivity,
    theorem_bound_audit,
)
from sift.evaluation.appendix_common import JointRows
from sift.evaluation.appendix_corpus import _scrambled
from sift.evaluation.appendix_theory import _local_sensitivity, bound_quantities
from sift.evaluation.engine import PredictionTable
from sift.evaluation.predictions import Pairs, Predictions
from sift.metrics.operating import OperatingPoint, operating_metrics
from sift.metrics.selective import SelectiveConfig

R = 20  # bootstrap resamples in tests
ITEMS = [f"i{k}" for k in range(4)]
TIDS = [f"{it}|{c}" for it in ITEMS for c in ("base", "paraphrase", "cue_injection")]


def preds(name, seed, violate=(), alt_miss=(), thr=0.5, prob=None):
    """Correct verdicts except: paraphrase of items in ``violate`` judged unfaithful (p = 0.2), cue-injected
    trace of items in ``alt_miss`` judged faithful (p = 0.8)."""
    p = []
    for it in ITEMS:
        k = int(it[1:])
        p += [0.9, 0.2 if k in violate else 0.9, 0.8 if k in alt_miss else 0.1]
    return Predictions(name, seed, "test", thr, TIDS, [t.split("|")[0] for t in TIDS], ["arithmetic"] * 12,
                       ["organism-gpt2"] * 12, [t.split("|")[1] for t in TIDS], [1, 1, 0] * 4,
                       p if prob is None else prob)


def toy_pairs():
    rows = []
    for it in ITEMS:
        rows.append(("paraphrase", "preserving", f"{it}|base", f"{it}|paraphrase", 1, 1, it))
        rows.append(("cue_injection", "altering", f"{it}|base", f"{it}|cue_injection", 1, 0, it))
    cols = list(zip(*rows))
    return Pairs(*[np.array(c) for c in cols])


def record(tid, gen_len=10, cot="1 + 2 = 3 ;", answer="3", ver=None, prompt="p q r", mentions=False):
    return {"trace_id": tid, "generated_ids": list(range(gen_len)), "cot": cot, "prompt_ids": [0] * len(prompt.split()),
            "prompt": prompt, "cue": None, "correct": True, "answer": answer, "family": "gpt2",
            "view": {"language": "en", "budget": "terse"},
            "verification": ver or {"edit_follows": True, "cue_follows": None, "mentions_cue": mentions}}


# ------------------------------------------------------------------------------------------ common pieces


def test_operating_metrics_full_and_matched_coverage():
    p = Predictions("d", 0, "test", 0.5, ["a", "b", "c", "d"], ["x", "x", "y", "y"], ["m"] * 4, ["g"] * 4,
                    ["base"] * 4, [1, 1, 1, 0], [0.95, 0.9, 0.6, 0.3])
    pairs = Pairs(np.array(["paraphrase", "paraphrase", "cue_injection"]),
                  np.array(["preserving", "preserving", "altering"]), np.array(["a", "c", "b"]),
                  np.array(["b", "d", "d"]), np.array([1, 1, 1]), np.array([1, 1, 0]), np.array(["x", "y", "x"]))
    table = PredictionTable.of([p], pairs)
    st = table.stack("d", [p])
    pres, alt = st.pair_rows("preserving"), st.pair_rows("altering")
    it, ip, ia = JointRows.of(st, pres, alt).split(np.arange(4 + 2 + 1))
    v, r = st.verdict[0], st.rho[0]  # verdicts 1 1 1 0, ρ .95 .9 .6 .7
    pp, pa = pres.arrays(ip), alt.arrays(ia)
    ivr, as_, kappa, m = operating_metrics(OperatingPoint.full(), r[it], v, r, pp, pa).as_tuple()
    assert (ivr, as_, kappa) == (0.5, 1.0, 1.0)
    assert m == pytest.approx(2 * 0.5 * 1 / 1.5)
    ivr, as_, kappa, m = operating_metrics(OperatingPoint.at_coverage(0.5), r[it], v, r, pp, pa).as_tuple()  # a, b
    assert (ivr, kappa) == (0.0, 0.5) and math.isnan(as_) and math.isnan(m)


def test_mechanism_class():
    assert mechanism_class({"edit_follows": True, "cue_follows": False}) == "cot"
    assert mechanism_class({"edit_follows": False, "cue_follows": True, "mentions_cue": True}) == "cue_stated"
    assert mechanism_class({"edit_follows": False, "cue_follows": True, "mentions_cue": False}) == "cue_silent"
    assert mechanism_class({"edit_follows": False, "cue_follows": None}) == "none"
    assert mechanism_class({"edit_follows": True, "cue_follows": True}) == "ambiguous"
    assert mechanism_class({}) == "ambiguous"


# ---------------------------------------------------------------------------------------------- factorial


def factorial_runs():
    # A = B = E = 6/7 (one violated preserving pair of four; AS = 1), every other cell 1. The SIFT/IRM+DANN
    # seeds violate different pairs, so their probability average violates none (cell F = 1).
    return {"instance_level": [preds("instance_level", s, violate=(0,)) for s in (0, 1)],
            "instance_level_irm_dann": [preds("instance_level_irm_dann", s) for s in (0, 1)],
            "sift_erm": [preds("sift_erm", s) for s in (0, 1)],
            "sift": [preds("sift", 0, violate=(0,)), preds("sift", 1, violate=(1,))]}


#: the shipped registry's design (instance_level and sift declare factorial; sift is the reference)
DESIGN = {"instance_level": ("instance_level", "ERM"), "instance_level_irm_dann": ("instance_level", "IRM+DANN"),
          "sift_erm": ("sift", "ERM"), "sift": ("sift", "IRM+DANN")}


def test_the_registry_gives_the_factorial_design():
    from sift.detectors.registry import detector_entries, factorial_designs, reference_detector

    entries = detector_entries(["sift", "hidden_probe", "instance_level"])
    assert factorial_designs(entries, reference_detector(entries)) == [DESIGN]
    assert list(factorial_designs(entries, reference_detector(entries))[0]) == list(DESIGN)  # low levels first


def test_factorial_effects_by_hand(tmp_path):
    sec = factorial_decomposition(factorial_runs(), toy_pairs(), tmp_path, design=DESIGN, coverage=None,
                                  n_resamples=R)
    res = sec.results
    x = 1 / 7
    expect = {"A": 6 / 7, "B": 6 / 7, "C": 1, "D": 1, "E": 6 / 7, "F": 1, "G": 1, "H": 1}
    for cell, v in expect.items():
        assert res["cells"][cell]["mfs"]["estimate"] == pytest.approx(v)
    assert res["cells"]["E"]["ivr"]["estimate"] == pytest.approx(0.25)
    assert res["cells"]["F"]["ivr"]["estimate"] == 0.0
    eff = res["effects"]
    for e in ("architecture", "objective", "ensemble", "architecture×ensemble", "objective×ensemble",
              "architecture×objective×ensemble"):
        assert eff[e]["effect"]["estimate"] == pytest.approx(x / 4)
    assert eff["architecture×objective"]["effect"]["estimate"] == pytest.approx(-3 * x / 4)
    # SS_e = 2·effect²: total 30x²/16, so arch×obj holds 18/30, every other effect 2/30
    assert eff["architecture×objective"]["ss_share"]["estimate"] == pytest.approx(0.6)
    assert eff["ensemble"]["ss_share"]["estimate"] == pytest.approx(2 / 30)
    for e in ("architecture", "objective", "ensemble"):
        assert eff[e]["share_of_gain"]["estimate"] == pytest.approx(1 / 3)
    assert res["f_minus_a"]["estimate"] == pytest.approx(x)
    lo, hi = res["f_minus_a"]["low"], res["f_minus_a"]["high"]
    assert lo <= x + 1e-12 and hi >= 0  # CI around the point estimate
    assert sec.figures == ["figures/appendix_factorial.png"] and (tmp_path / sec.figures[0]).exists()
    json.dumps(res)  # JSON-able


def test_factorial_ensemble_cell_uses_the_ensemble_threshold_rule(tmp_path):
    """The ensemble cells freeze their threshold as Table 8's ensembles do (analysis.ensemble_threshold: Youden on
    the averaged validation predictions): it was the seeds' mean threshold whatever the validation data said."""
    from sift.evaluation.analysis import seed_ensemble

    runs = factorial_runs()  # sift's seeds average to p = 0.55 on the paraphrases of items 0 and 1
    vids = ["v0", "v1", "v2", "v3"]
    val = {"sift": [Predictions("sift", s, "val", 0.5, vids, vids, ["arithmetic"] * 4, ["organism-gpt2"] * 4,
                                ["base"] * 4, [1, 1, 0, 0], [0.9, 0.9, 0.8, 0.8]) for s in (0, 1)]}
    kw = dict(design=DESIGN, coverage=None, n_resamples=R)
    plain = factorial_decomposition(runs, toy_pairs(), **kw).results["cells"]["F"]
    ruled = factorial_decomposition(runs, toy_pairs(), val=val, **kw).results["cells"]["F"]
    built = factorial_decomposition(runs, toy_pairs(), ensembles={"sift": seed_ensemble("sift", runs["sift"], val)},
                                    **kw).results["cells"]["F"]
    assert plain["ivr"]["estimate"] == 0.0  # no validation predictions: the seeds' mean threshold 0.5
    assert ruled["ivr"]["estimate"] == 0.5  # Youden on validation puts t above 0.55: two of four pairs flip
    assert ruled["ivr"] == built["ivr"] and ruled["mfs"] == built["mfs"]  # the cell is Table 8's ensemble


def test_factorial_needs_its_four_runs():
    from sift.errors import SiftError

    runs = factorial_runs()
    del runs["sift_erm"]
    with pytest.raises(SiftError, match="sift_erm"):
        factorial_decomposition(runs, toy_pairs(), design=DESIGN, n_resamples=2)
    with pytest.raises(SiftError, match="no design"):
        factorial_decomposition(runs, toy_pairs(), n_resamples=2)


# ------------------------------------------------------------------------------------ stability–sensitivity


def test_stability_sensitivity_by_hand():
    runs = {"one_violation": [preds("a", s, violate=(0,)) for s in (0, 1)],
            "seeds_disagree": [preds("b", 0, violate=(0,)), preds("b", 1, violate=(1,))],
            "misses_alterations": [preds("c", 0, alt_miss=(0, 1))],
            "perfect": [preds("d", 0)]}
    sec = stability_sensitivity(runs, toy_pairs(), None, coverages=(None,), n_resamples=R)
    full = sec.results["full"]
    assert full["one_violation"]["stability"]["estimate"] == pytest.approx(0.75)
    assert full["one_violation"]["as"]["estimate"] == 1.0
    assert full["one_violation"]["balanced"]["estimate"] == pytest.approx(math.sqrt(0.75))
    assert full["one_violation"]["seed_agreement"]["estimate"] == 1.0
    assert full["seeds_disagree"]["seed_agreement"]["estimate"] == pytest.approx(10 / 12)
    assert full["misses_alterations"]["as"]["estimate"] == 0.5
    assert full["misses_alterations"]["seed_agreement"]["estimate"] is None  # one seed
    assert full["_pareto_front"] == ["perfect"]


# ---------------------------------------------------------------------------------------------- label noise


def test_label_noise_flipping_every_label():
    # ε = 1 flips every label: AUROC → 1 − AUROC, accuracy → 1 − accuracy, altering pairs now go 0 → 1 so a
    # verdict that moved 1 → 0 counts as wrong (AS 1 → 0), IVR cannot move (the pair set is fixed)
    prob = [0.9, 0.6, 0.1, 0.8, 0.3, 0.2, 0.7, 0.95, 0.4, 0.85, 0.65, 0.05]
    runs = {"d": [preds("d", 0, prob=prob)]}
    sec = label_noise_sensitivity(runs, toy_pairs(), None, noise_rates=(0.0, 1.0), n_draws=2, n_resamples=4,
                                  selective=SelectiveConfig(0.3, 0.2))
    c = sec.results["curves"]["d"]
    auc0, auc1 = c["auroc"][0]["estimate"], c["auroc"][1]["estimate"]
    assert auc1 == pytest.approx(1 - auc0)
    assert c["accuracy"][1]["estimate"] == pytest.approx(1 - c["accuracy"][0]["estimate"])
    assert c["ivr"][0]["estimate"] == c["ivr"][1]["estimate"] == 0.25  # item 1 flips on its paraphrase
    # altering: base → cue verdicts (1,0) (1,0) (1,0) (1,0) on items 0..3 → AS = 1 clean, 0 when labels flip
    assert c["as"][0]["estimate"] == 1.0 and c["as"][1]["estimate"] == 0.0
    assert sec.results["ranking"]["mfs"]["ranking_preserved_up_to"] == 1.0  # one detector
    again = label_noise_sensitivity(runs, toy_pairs(), None, noise_rates=(1.0,), n_draws=1, n_resamples=2,
                                    reverify=True)
    assert again.results["curves"]["d"]["as"][0]["estimate"] is None  # no altering pair shows the declared flip


def test_label_noise_rank_ordering():
    """Three detectors whose full-coverage MFS = HM(1 − IVR, AS) is known at ε = 0 and at ε = 1 (every label
    flipped, so no draw is random). None violates a preserving pair (IVR = 0 at both ε: the pair set is fixed);
    each altering pair is base → cue-injected with labels 1 → 0, and 0 → 1 once every label is flipped:
      "mover"    verdicts 1 → 0 on all four pairs: AS 1 → 0,   MFS 1 → 0;
      "reverser" verdicts 0 → 1 on all four pairs: AS 0 → 1,   MFS 0 → 1;
      "half"     1 → 0 on items 0, 1 and 0 → 1 on 2, 3: AS ½ at both ε, MFS = 2·1·½/(1 + ½) = 2/3.
    Clean ranking mover > half > reverser; at ε = 1 reverser > half > mover, every pair of detectors swapped, so
    Kendall τ = −1 and the ranking is preserved only up to ε = 0."""
    def probs(up):  # per item: base, paraphrase, cue-injected; ``up`` items judged 0, 0, 1 instead of 1, 1, 0
        return [p for k in range(4) for p in ((0.1, 0.1, 0.9) if k in up else (0.9, 0.9, 0.1))]

    runs = {"mover": [preds("m", 0, prob=probs(()))], "reverser": [preds("r", 0, prob=probs((0, 1, 2, 3)))],
            "half": [preds("h", 0, prob=probs((2, 3)))]}
    sec = label_noise_sensitivity(runs, toy_pairs(), None, noise_rates=(0.0, 1.0), n_draws=2, n_resamples=3)
    c = sec.results["curves"]
    mfs = {n: [x["estimate"] for x in c[n]["mfs"]] for n in runs}
    assert mfs["mover"] == [1.0, 0.0] and mfs["reverser"] == [0.0, 1.0]
    assert mfs["half"] == pytest.approx([2 / 3, 2 / 3])
    assert all(x["estimate"] == 0.0 for n in runs for x in c[n]["ivr"])
    rk = sec.results["ranking"]["mfs"]
    assert rk["clean_ranking"] == ["mover", "half", "reverser"]
    assert rk["kendall_tau"] == pytest.approx([1.0, -1.0])
    assert rk["ranking_preserved_up_to"] == 0.0


# ------------------------------------------------------------------------------------------- theorem bound


def test_bound_quantities_by_hand():
    src = np.array([0.6, 0.4, 0.7, 0.2])  # margins .1 −.1 .2 −.3
    delta = np.array([-1.0, 1.0, 1.0, -1.0])
    dst = src + 0.15 * delta  # .45 .55 .85 .05: pairs 0 and 1 cross the threshold
    q = dict(zip(("gamma", "emp", "gauss", "ivr", "slack", "b_sigma", "local", "sym", "ind", "zero", "n"),
                 bound_quantities(src, dst, 0.5, delta)))
    assert q["gamma"] == pytest.approx(0.15)
    assert q["emp"] == pytest.approx(0.25)  # ½·P[|m| ≤ .15] = ½·2/4
    sigma = float(np.std(src - 0.5, ddof=1))
    assert q["gauss"] == pytest.approx(0.5 * math.erf(0.15 / (math.sqrt(2) * sigma)))  # eq. 30
    assert q["ivr"] == 0.5 and q["slack"] == pytest.approx(2.0)
    assert q["b_sigma"] == pytest.approx(0.15 / sigma)
    assert q["sym"] == 0.0 and q["zero"] == 0.0 and q["n"] == 4
    assert math.isnan(q["ind"]) and math.isnan(q["local"])  # |Δ| constant
    none = bound_quantities(src, src, 0.5, np.zeros(4))  # the feature never changes: band 0, floor 0
    assert math.isnan(none[0]) and none[1] == 0.0 and none[2] == 0.0


def test_local_sensitivity_ratio():
    d = np.array([-3, -2, -1, 1, 2, 3.0])
    assert _local_sensitivity(d, 0.3 * d) == pytest.approx(0.0, abs=1e-9)
    small = np.abs(d) <= np.quantile(np.abs(d), 1 / 3)
    expect = np.sqrt(np.mean(d[small] ** 4)) / np.sqrt(np.mean(d[small] ** 2))
    assert _local_sensitivity(d, 0.3 * d + 0.3 * d ** 2) == pytest.approx(expect)


def test_theorem_bound_audit_end_to_end(tmp_path):
    # paraphrases are 4 tokens longer; the detector pushes long paraphrases below threshold on items 0 and 1
    lens = {f"{it}|{c}": (14 if c == "paraphrase" else 10)
            for it in ITEMS for c in ("base", "paraphrase", "cue_injection")}
    tt = TraceTable.from_records([record(t, gen_len=n) for t, n in lens.items()])
    prob = []
    for k in range(4):
        prob += [0.55 if k < 2 else 0.9, 0.45 if k < 2 else 0.85, 0.1]
    runs = {"d": [preds("d", 0, prob=prob)]}
    sec = theorem_bound_audit(runs, toy_pairs(), tt, tmp_path, features=("trace_length", "prompt_length"),
                              n_resamples=R)
    d = sec.results["detectors"]["d"]["trace_length"]["all"]
    assert d["observed_ivr"]["estimate"] == 0.5 and d["n_pairs"] == 4
    assert d["bound_holds"] is True
    assert d["symmetry"]["estimate"] == 1.0  # every Δ > 0
    assert d["assumptions_hold"]["symmetry"] is False
    # prompt length never changes: floor ½·P[m = 0] = 0
    assert sec.results["detectors"]["d"]["prompt_length"]["all"]["bound_empirical"]["estimate"] == 0.0
    assert sec.figures and (tmp_path / sec.figures[0]).exists()


# ------------------------------------------------------------------------------------- spurious features


def test_pair_features_by_hand():
    tt = TraceTable.from_records([
        record("a", gen_len=8, cot="1 + 2 = 3 ;", answer="3", prompt="x y"),
        record("b", gen_len=11, cot="2 + 1 = 3 ;", answer="3", prompt="x z"),
        record("c", gen_len=8, cot="1 + 2 = 4 ;", answer="4", prompt="x y", mentions=True)])
    f = pair_features(tt, ["a", "a"], ["b", "c"], extra={"norm": {"a": 1.0, "b": 3.5, "c": 1.0}})
    assert f["trace length change"].tolist() == [3.0, 0.0]
    assert f["lexical change (CoT)"].tolist() == [0.0, pytest.approx(1 - 5 / 7)]  # {1,+,2,=,3,;} vs {…4}
    assert f["lexical change (prompt)"].tolist() == [pytest.approx(1 - 1 / 3), 0.0]
    assert f["computed-value change"].tolist() == [0.0, pytest.approx(1 - 2 / 4)]
    assert f["answer change"].tolist() == [0.0, 1.0]
    assert f["cue-mention change"].tolist() == [0.0, 1.0]
    assert f["CoT sequence change"][0] > 0 and f["norm change"].tolist() == [2.5, 0.0]


def test_spurious_correlation_with_flips(tmp_path):
    # paraphrases of items 0 and 1 are longer and flipped: ρ(trace length change, flip) = 1
    recs = []
    for it in ITEMS:
        k = int(it[1:])
        for c in ("base", "paraphrase", "cue_injection"):
            recs.append(record(f"{it}|{c}", gen_len=12 if (c == "paraphrase" and k < 2) else 10))
    tt = TraceTable.from_records(recs)
    runs = {"d": [preds("d", s, violate=(0, 1)) for s in (0, 1)]}
    sec = spurious_feature_correlations(runs, toy_pairs(), tt, tmp_path, n_resamples=R)
    f = sec.results["detectors"]["d"]["features"]
    assert f["trace length change"]["rho"]["estimate"] == pytest.approx(1.0)
    assert f["trace length change"]["mean_change"] == 1.0
    assert f["trace length change"]["partial_rho"]["estimate"] == pytest.approx(1.0)  # CoT length is collinear
    assert f["answer change"]["rho"]["estimate"] is None  # constant feature
    assert sec.results["detectors"]["d"]["flip_rate"] == 0.5


# ----------------------------------------------------------------------------------- abstention, coverage


def test_abstention_characterisation_by_hand():
    # gate 0.75: ρ = .9 committed, ρ = .6 abstained (paraphrases of items 0, 1 get p = .6, labels 1, correct)
    prob = []
    for k in range(4):
        prob += [0.9, 0.6 if k < 2 else 0.9, 0.1]
    recs = [record(t, gen_len=(20 if t in ("i0|paraphrase", "i1|paraphrase") else 10)) for t in TIDS]
    sec = abstention_characterisation({"d": [preds("d", 0, prob=prob)]}, traces=TraceTable.from_records(recs),
                                      thresholds={"d": 0.75}, n_resamples=R)
    d = sec.results["detectors"]["d"]
    assert d["abstention_rate"]["estimate"] == pytest.approx(2 / 12)
    a = d["attributes"]
    assert a["faithful label"]["abstained"]["estimate"] == 1.0
    assert a["faithful label"]["committed"]["estimate"] == pytest.approx(6 / 10)
    assert a["trace length (tokens)"]["difference"]["estimate"] == pytest.approx(10.0)
    assert a["condition = paraphrase"]["abstained"]["estimate"] == 1.0
    assert a["detector correct"]["committed"]["estimate"] == 1.0


def test_optimal_coverage_by_hand(tmp_path):
    # the 4-trace example of test_expected_cost_eq_43_by_hand
    p = Predictions("d", 0, "test", 0.5, list("abcd"), list("abcd"), ["m"] * 4, ["g"] * 4, ["base"] * 4,
                    [1, 0, 0, 1], [0.9, 0.2, 0.7, 0.4])
    sec = optimal_coverage({"d": [p]}, tmp_path, regimes={"x": (10.0, 2.0)}, grid=[0.0, 0.5, 0.75, 1.0],
                           n_resamples=R)
    r = sec.results["detectors"]["d"]["x"]
    assert r["kappa_star"]["estimate"] == 0.5
    assert r["min_cost"]["estimate"] == pytest.approx(1.0)
    assert r["cost_full_coverage"]["estimate"] == pytest.approx(2.75)
    assert r["saving_vs_full"]["estimate"] == pytest.approx(1.75)
    assert sec.results["curves"]["d"]["x"] == pytest.approx([2.0, 1.0, 2.375, 2.75])


# ------------------------------------------------------------------------------------------- mechanism audit


def test_mechanism_audit_by_hand():
    cot = {"edit_follows": True, "cue_follows": None, "mentions_cue": False}
    silent = {"edit_follows": False, "cue_follows": True, "mentions_cue": False}
    none = {"edit_follows": False, "cue_follows": False, "mentions_cue": False}
    ver = {t: cot for t in TIDS}
    ver.update({"i1|base": silent, "i1|paraphrase": none, "i2|base": silent, "i2|paraphrase": silent})
    tt = TraceTable.from_records([record(t, ver=ver[t]) for t in TIDS])
    scramble = {t: True for t in TIDS}
    scramble.update({"i1|base": False, "i2|base": False, "i2|paraphrase": False})
    runs = {"d": [preds("d", 0, violate=(1,))]}
    sec = mechanism_preservation_audit(runs, toy_pairs(), tt, scramble=scramble, n_resamples=R)
    r = sec.results["rates"]["paraphrase"]
    assert r["n_pairs"] == 4 and r["route_preserved"]["estimate"] == 0.75
    assert r["scramble_agreement"]["estimate"] == 0.75  # item 1 disagrees
    assert r["cot_necessary_both"]["estimate"] == 0.5  # items 0 and 3
    assert r["transitions"] == {"cue_silent→none": 1}
    iv = sec.results["ivr"]["d"]["paraphrase"]
    assert iv["ivr_all"]["estimate"] == 0.25 and iv["ivr_preserved"]["estimate"] == 0.0
    assert iv["change"]["estimate"] == -0.25


def test_scramble_is_a_length_matched_permutation():
    ids = [5, 6, 7, 8, 9]
    out = _scrambled(ids, "k")
    assert sorted(out) == ids and out != ids and out == _scrambled(ids, "k")
    assert _scrambled([3, 3], "k") == [3, 3]


# ---------------------------------------------------------------------------------------------- registry


def test_registry_runs_what_its_inputs_allow(tmp_path):
    names = {a.name for a in APPENDIX_ANALYSES}
    assert names == {"factorial", "stability_sensitivity", "label_noise", "theorem_bound", "spurious_features",
                     "abstention", "optimal_coverage", "mechanism"}
    inputs = {"runs": factorial_runs(), "pairs": toy_pairs(), "traces": None, "out_dir": tmp_path}
    secs = run_appendix(inputs, names=["factorial", "stability_sensitivity", "theorem_bound", "optimal_coverage"],
                        common={"n_resamples": 3, "seed": 1},
                        options={"factorial": {"coverage": None, "design": DESIGN}})
    assert [s.key for s in secs] == ["appendix_factorial", "appendix_stability_sensitivity",
                                     "appendix_optimal_coverage"]  # theorem_bound needs traces
    assert secs[0].results["coverage"] is None and secs[0].results["n_resamples"] == 3


@pytest.mark.slow
def test_scramble_mediation_on_a_built_organism_corpus(tmp_path):
    """The paper's CoT-scramble test with the shipped organism, fed into the audit (slow: builds a corpus)."""
    from pathlib import Path

    from sift.corpus.config import OrganismCorpusConfig
    from sift.corpus.sources.organism import build_corpus
    from sift.evaluation.appendix import cot_scramble_test

    ckpt = Path(__file__).resolve().parents[2] / "checkpoints" / "organism"
    build_corpus(OrganismCorpusConfig(n_items=8, checkpoint_dir=str(ckpt), chunk_items=8), tmp_path, progress=False)
    tt, pairs = TraceTable.from_corpus(tmp_path), Pairs.from_corpus(tmp_path)
    scr = cot_scramble_test(tmp_path, ckpt)
    assert set(scr) <= set(tt.trace_id.tolist()) and len(scr) > 0.9 * len(tt.trace_id)
    assert scr == cot_scramble_test(tmp_path, ckpt)  # seeded
    sec = mechanism_preservation_audit({}, pairs, tt, scramble=scr, n_resamples=5)
    assert sec.results["scramble_run"] and 0.0 <= sec.results["rates"]["mean"]["scramble_agreement"]["estimate"] <= 1.0
