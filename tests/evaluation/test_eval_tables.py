"""Report tables on a hand-computable toy (tests/evaluation/ev_toy.py): every number checked by hand."""

import math

import ev_toy as toy
import numpy as np
import pytest
from ev_toy import CERT, betting_reference, est
from sklearn.metrics import roc_auc_score

from sift.evaluation.engine import ReportOptions
from sift.evaluation.predictions import Predictions
from sift.evaluation.sections.ablations import ablation_table
from sift.evaluation.sections.ensemble import ensemble_table
from sift.evaluation.sections.main_table import main_table
from sift.evaluation.sections.selective_risk import selective_risk_section
from sift.evaluation.sections.transfer_matrix import transfer_matrix


def test_main_table_hand_values():
    runs = {"toy": [toy.predictions(0), toy.predictions(1)]}
    s = main_table(runs, toy.pairs(), options=ReportOptions(n_resamples=50, selective=CERT))
    r = s.results["detectors"]["toy"]
    assert s.results["axes"] == ["paraphrase", "hint_format"]
    # per-axis IVR, mean over the two seeds: paraphrase (2/4 + 0)/2, hint format (1/3 + 2/3)/2
    assert est(r, "ivr/paraphrase") == pytest.approx(0.25)
    assert est(r, "ivr/hint_format") == pytest.approx(0.5)
    assert est(r, "ivr") == pytest.approx((5 / 12 + 1 / 3) / 2)
    assert est(r, "as") == pytest.approx(0.5)
    assert est(r, "mfs") == pytest.approx((7 / 13 + 4 / 7) / 2)
    aucs = [roc_auc_score(p.label, p.prob) for p in runs["toy"]]
    assert est(r, "in_dist_auroc") == pytest.approx(np.mean(aucs))
    assert r["seed_stability"]["std"] == pytest.approx(np.std(aucs, ddof=1))
    # seed-repeat decomposition over the 7 preserving pairs (App. E.1)
    d = r["seed_repeat"]
    assert (d["floor"], d["shift_attributable"], d["overlap"], d["raw"]) == pytest.approx((3 / 7, 3 / 7, 2 / 7, 4 / 7))
    assert d["raw"] == pytest.approx(d["floor"] + d["shift_attributable"] - d["overlap"])
    # certified subset: rho >= 0.75 keeps 7/15 traces, all correct: items (hash order i2, i3, i0, i1) hold 2, 1, 4, 0
    # of them, M = 4. Every plug-in bet hits the cap 0.95, errors are 0, so the item bound U solves
    # (1 + 2y)(1 + y)(1 + 4y) = 1/δ = 2 with y = 0.95·U/(4(1 − U)): 8y³ + 14y² + 7y − 1 = 0, U ≈ 0.3258 <= 0.7.
    # Pairs with both traces certified all come from item i0: no violation, the altering pair moves -> MFS = kappa
    sg = r["sgr"][0]
    assert sg["feasible"] and sg["threshold"] == 0.75 and sg["coverage"] == pytest.approx(7 / 15)
    y = max(np.roots([8, 14, 7, -1]).real)
    assert sg["bound"] == pytest.approx(4 * y / 0.95 / (1 + 4 * y / 0.95), abs=1e-9)
    # seed 1 certifies the same traces (its changed traces have rho < 0.75)
    assert est(r, "coverage") == pytest.approx(7 / 15)
    assert (est(r, "cert_ivr"), est(r, "cert_as"), est(r, "cert_mfs")) == pytest.approx((0.0, 1.0, 7 / 15))
    for k in ("ivr", "mfs", "in_dist_auroc"):
        assert r[k]["low"] <= r[k]["estimate"] + 1e-9 or math.isnan(r[k]["low"])
    assert "| toy |" in s.markdown and "(c) Seed-repeat" in s.markdown


def test_main_table_transfer_gap_and_infeasible_sgr():
    runs = {"toy": [toy.predictions(0)]}
    shifted = toy.predictions(0, split="transfer", probs={"i0/b": 0.2, "i1/b": 0.1})  # two positives now ranked low
    s = main_table(runs, toy.pairs(), transfer={"cross-domain": {"toy": [shifted]}},
                   options=ReportOptions(n_resamples=0))
    r = s.results["detectors"]["toy"]
    a_in = roc_auc_score(runs["toy"][0].label, runs["toy"][0].prob)
    a_tr = roc_auc_score(shifted.label, shifted.prob)
    assert est(r, "transfer_auroc/cross-domain") == pytest.approx(a_tr)
    assert est(r, "gap") == pytest.approx(a_in - a_tr)
    assert r["ivr"]["low"] is None  # no resamples: no CI
    # 15 traces cannot certify risk <= 0.25 at delta = 0.05 over 51 candidates
    # an infeasible seed certifies nothing: coverage 0 and certified MFS 0 (counted), certified IVR/AS undefined
    assert not r["sgr"][0]["feasible"] and est(r, "coverage") == 0.0 and est(r, "cert_mfs") == 0.0
    assert est(r, "cert_ivr") is None and r["n_feasible"] == 0
    assert r["seed_repeat"]["n_seed_pairs"] == 0
    # every undefined cell says why, in results.json and under the table
    assert r["cert_ivr"]["reason"].startswith("nothing certified (coverage 0): SGR infeasible")
    assert "reason" not in r["mfs"] and "reason" not in r["gap"]
    assert "toy · cert_ivr, cert_as: nothing certified" in s.markdown and "| 0/1 |" in s.markdown


def test_main_table_says_which_detector_lacks_a_transfer_run():
    runs = {"toy": [toy.predictions(0)], "other": [toy.predictions(1)]}
    shifted = toy.predictions(0, split="transfer")
    s = main_table(runs, toy.pairs(), transfer={"cross-domain": {"toy": [shifted]}},
                   options=ReportOptions(n_resamples=0))
    r = s.results["detectors"]["other"]
    assert est(r, "transfer_auroc/cross-domain") is None and est(r, "gap") is None
    assert r["transfer_auroc/cross-domain"]["reason"] == "no transfer run of this detector for cross-domain"
    assert r["gap"]["reason"] == "no transfer AUROC to compare with"
    assert "reason" not in s.results["detectors"]["toy"]["transfer_auroc/cross-domain"]


def test_ensemble_table_builds_average_and_gain():
    runs = {"toy": [toy.predictions(0), toy.predictions(1)]}
    s = ensemble_table(runs, toy.pairs(), n_resamples=20)
    r = s.results["detectors"]["toy"]
    assert s.results["built_here"] == ["toy"]
    assert est(r, "single_mfs") == pytest.approx((7 / 13 + 4 / 7) / 2)
    assert est(r, "ensemble_ivr") == pytest.approx(11 / 24)
    assert est(r, "ensemble_as") == pytest.approx(0.5)
    assert est(r, "ensemble_mfs") == pytest.approx(13 / 25)
    assert est(r, "gain") == pytest.approx(13 / 25 - (7 / 13 + 4 / 7) / 2)
    assert "mean of the members' thresholds" in r["threshold_from"]
    # invariance kept by seed 0 vs the ensemble on 7 preserving pairs: P-i3 only seed 0 loses, H-i3 only the
    # ensemble loses -> b = 1, c = 1, both in item i3: d_i3 = 0, no discordant item, p = 1
    t = r["invariance_test"]
    assert (t["b"], t["c"], t["n_pairs"], t["n_items"]) == (1, 1, 7, 4) and t["p_value"] == pytest.approx(1.0)
    assert t["n_discordant_items"] == 0 and "sign-flip" in s.markdown
    # a given ensemble (seed None) is used as is
    ens = toy.predictions(None)
    s2 = ensemble_table({"toy": [toy.predictions(0), ens]}, toy.pairs(), n_resamples=0)
    assert s2.results["built_here"] == [] and est(s2.results["detectors"]["toy"], "gain") == pytest.approx(0.0)


def test_selective_section_hand_values(tmp_path):
    runs = {"toy": [toy.predictions(0)], "copy": [toy.predictions(0, detector="copy")]}
    s = selective_risk_section(runs, toy.pairs(), out_dir=tmp_path,
                               options=ReportOptions(selective=CERT, coverages=(0.2, 1.0), reference="toy",
                                                     n_resamples=50))
    r = s.results["detectors"]["toy"]
    # 5 errors of 15 at full coverage; the 3 most confident traces are correct
    assert r["by_coverage"]["1.0"]["risk"] == pytest.approx(5 / 15)
    assert r["by_coverage"]["0.2"]["risk"] == 0.0
    # full coverage, δ/2 = 0.25: items i2, i3, i0, i1 hold (4, 4, 4, 3) traces with (1, 2, 0, 2) errors, M = 4
    assert r["by_coverage"]["1.0"]["bound"] == pytest.approx(
        betting_reference([4, 4, 4, 3], [1, 2, 0, 2], 4, 0.25, 0.7), abs=1e-4)
    # kappa = 0.7: ρ ≥ the 11th largest ρ (0.6, tied three times) certifies 13 traces holding 4 errors (i1/p, i1/a,
    # i3/a, i2/h); the old rule (exactly 11, ties by position) gave 2 / 11
    assert r["matched"]["risk"]["estimate"] == pytest.approx(4 / 13)
    op = r["sgr"]["0.7"]
    assert op["coverage"] == pytest.approx(7 / 15) and op["risk"] == 0.0
    c = s.results["comparisons"]["copy"]
    assert c["difference"]["estimate"] == 0.0 and c["p_value"] == pytest.approx(1.0)
    assert s.figures == ["risk_coverage.png"] and (tmp_path / "risk_coverage.png").stat().st_size > 1000


def _cell(probs, labels=(0, 0, 1, 1), items=("a", "b", "c", "d")):
    n = len(probs)
    return Predictions("sift", 0, "test", 0.5, np.array([f"t{i}" for i in range(n)]), np.array(items),
                       np.array(["d"] * n), np.array(["m"] * n), np.array(["base"] * n), np.array(labels),
                       np.array(probs, float))


def test_transfer_matrix_hand_values(tmp_path):
    cells = {("A", "A"): _cell([0.1, 0.2, 0.8, 0.9]), ("A", "B"): _cell([0.9, 0.8, 0.2, 0.1]),
             ("B", "A"): _cell([0.5, 0.5, 0.5, 0.5]), ("B", "B"): [_cell([0.1, 0.2, 0.8, 0.9]),
                                                                     _cell([0.1, 0.9, 0.8, 0.2])]}
    s = transfer_matrix(cells, families={"A": "f", "B": "f"}, out_dir=tmp_path, n_resamples=20)
    res = s.results
    # B->B: mean over two seeds of AUROC 1 and 0.5
    assert res["auroc"] == [[1.0, 0.0], [0.5, 0.75]]
    assert res["rows"]["A"] == {"in_dist": 1.0, "mean_transfer": 0.0, "gap": 1.0}
    assert res["summary"]["mean_in_dist"] == pytest.approx(0.875)
    assert res["summary"]["mean_transfer"] == pytest.approx(0.25)
    assert res["summary"]["gap"] == pytest.approx(0.625)
    assert res["families"]["within_family"] == pytest.approx(0.25) and res["families"]["cross_family"] is None
    assert (tmp_path / "transfer_matrix.png").is_file()


def test_transfer_matrix_figure_keeps_long_model_names(tmp_path):
    """A held-out model's name (40 characters) is drawn whole: the figure grows with its labels."""
    import matplotlib.image as mpimg

    from sift.evaluation.sections.transfer_matrix import _plot_matrix

    name = "qwen2.5-coder-1.5b-instruct-q4_k_m"
    _plot_matrix(np.array([[0.7, 0.5]]), [f"all but {name}"], ["in-distribution", name], tmp_path, "m.png", "t")
    _plot_matrix(np.array([[0.7, 0.5]]), ["a"], ["b", "c"], tmp_path, "short.png", "t")
    long_w, short_w = mpimg.imread(tmp_path / "m.png").shape[1], mpimg.imread(tmp_path / "short.png").shape[1]
    # 42 characters at 8 pt are about 2.3 in (280 px at 120 dpi) wider than a one-letter label
    assert long_w - short_w > 250


def test_ablation_table_relative_changes():
    ab = {"full": [toy.predictions(0)], "no_irm": [toy.predictions(1)]}
    s = ablation_table(ab, toy.pairs(), options=ReportOptions(n_resamples=0))
    v = s.results["variants"]
    assert s.results["reference"] == "full"
    assert v["no_irm"]["ivr_change"] == pytest.approx((1 / 3 - 5 / 12) / (5 / 12))
    assert v["no_irm"]["mfs_change"] == pytest.approx((4 / 7 - 7 / 13) / (7 / 13))
    assert v["full"]["ivr_change"] == 0.0
    assert "-20%" in s.markdown


def _run(split, wrong, n_items=40, per=5, detector="d"):
    """``n_items`` × ``per`` traces, label 1, prob 0.95 (right) or 0.05 (wrong) per the ``wrong`` mask."""
    n = n_items * per
    wrong = np.resize(np.asarray(wrong, bool), n)
    return Predictions(detector, 0, split, 0.5, np.array([f"{split}{i}" for i in range(n)]),
                       np.repeat([f"{split}-i{k}" for k in range(n_items)], per), np.array(["d"] * n),
                       np.array(["m"] * n), np.array(["base"] * n), np.ones(n, int), np.where(wrong, 0.05, 0.95))


def test_selective_section_explains_certified_runs_above_alpha():
    """Certified on a clean calibration split (60 items, no error); on the test split the risk is 0.6 (its 95 %
    lower bound over items clears α: a failure) or 0.3 on 6 items (lower bound ≤ α: test-sample noise)."""
    from sift.metrics.selective import SelectiveConfig

    calib = {"d": [_run("calib", [False], n_items=60)]}
    bad = {"d": [_run("test", [True, True, True, False, False])]}
    s = selective_risk_section(bad, None, calib=calib,
                               options=ReportOptions(selective=SelectiveConfig(alphas=(0.25,)), n_resamples=0))
    op = s.results["detectors"]["d"]["sgr"]["0.25"]["runs"][0]
    assert op["feasible"] and op["n_items"] == 60 and op["risk"] == pytest.approx(0.6)
    assert "failure event" in op["above_alpha"] and "failure event" in s.markdown
    noisy = {"d": [_run("test", [True] * 3 + [False] * 7, n_items=6)]}
    s = selective_risk_section(noisy, None, calib=calib,
                               options=ReportOptions(selective=SelectiveConfig(alphas=(0.25,)), n_resamples=0))
    op = s.results["detectors"]["d"]["sgr"]["0.25"]["runs"][0]
    assert op["risk"] == pytest.approx(0.3) and "sampling noise" in op["above_alpha"]
