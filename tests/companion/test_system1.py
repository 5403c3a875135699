"""System-1 audit metrics (paper 003): spec system1-and-edct-metrics.md §A5 (T1–T7, T11) and table checks."""

import math

import numpy as np
import pytest

from sift.companion import system1 as S
from sift.companion._stats import clopper_pearson, holm
from sift.errors import SiftError


def test_t1_confidence_transform():
    p = np.array([[0.6, 0.3, 0.1], [1 / 3, 1 / 3, 1 / 3], [1.0, 0.0, 0.0]])
    np.testing.assert_allclose(S.confidence_entropy(p), [0.182655, 0.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(S.confidence_margin(p), [0.4, 0.0, 1.0], atol=1e-12)
    p2 = np.array([[0.9, 0.1], [0.99, 0.01]])
    np.testing.assert_allclose(S.confidence_entropy(p2), [0.531004, 0.919207], atol=1e-6)
    np.testing.assert_allclose(S.confidence_margin(p2), [0.8, 0.98], atol=1e-12)
    np.testing.assert_allclose(S.confidence_entropy([0.9, 0.01]), [0.531004, 0.919207], atol=1e-6)  # Noul


def test_identify_confidence_transform():
    p = np.random.default_rng(0).dirichlet(np.ones(3), size=50)
    assert S.identify_confidence_transform(p, S.confidence_entropy(p)).match == "entropy"
    ident = S.identify_confidence_transform(p, S.confidence_margin(p))
    assert ident.match == "margin" and ident.max_abs_error["entropy"] > 1e-3
    assert S.identify_confidence_transform(p, np.full(50, 0.5)).match is None


def test_t2_ece():
    conf = np.r_[np.full(5, 0.65), np.full(5, 0.95)]
    correct = np.r_[1, 1, 1, 0, 0, np.ones(5)]
    w = S.calibration_error(conf, correct)
    assert w.ece == pytest.approx(0.05) and w.mce == pytest.approx(0.05)
    assert w.bin_sizes.tolist() == [5, 5] and w.bin_accuracy.tolist() == [0.6, 1.0]
    m = S.calibration_error(conf, correct, binning="mass")
    assert m.ece == pytest.approx(0.26) and m.mce == pytest.approx(0.65)
    assert S.calibration_error([1.0, 0.95], [0, 1]).ece == pytest.approx(0.475)
    assert S.bin_indices([0.3, 0.0, 1.0, 0.1000001])[:3].tolist() == [2, 0, 9]
    assert S.bin_indices([0.1000001]).tolist() == [1]
    u = S.calibration_error([0.15, 0.15, 0.85], [0, 0, 1], weighting="uniform")
    assert u.ece == pytest.approx((0.15 + 0.15) / 2)


def test_ece_properties_and_ci():
    rng = np.random.default_rng(3)
    conf = rng.uniform(0.5, 1.0, 300)
    correct = (rng.random(300) < conf - 0.1).astype(float)
    r = S.calibration_error(conf, correct)
    assert r.ece >= abs(correct.mean() - conf.mean()) - 1e-12
    assert r.mce >= r.ece and 0 <= r.ece <= 1
    # all bins over-confident → ECE equals the global gap (HANS Choice pattern)
    conf2 = np.r_[np.full(10, 0.95), np.full(10, 0.75)]
    corr2 = np.r_[np.ones(7), np.zeros(3), np.ones(5), np.zeros(5)]
    assert S.calibration_error(conf2, corr2).ece == pytest.approx(conf2.mean() - corr2.mean())
    ci = S.ece_ci(conf, correct, n_resamples=200, seed=1)
    assert ci.estimate == pytest.approx(r.ece) and ci.low <= ci.high
    assert S.ece_ci(conf, correct, n_resamples=200, seed=1) == ci
    d = S.delta_ece_ci(conf, correct, conf, correct, n_resamples=50)
    assert d.estimate == d.low == d.high == 0.0


def test_t3_brier():
    assert S.brier_score([[0.7, 0.2, 0.1]], [0]) == pytest.approx(0.14)
    assert S.brier_score([0.9], [1]) == pytest.approx(0.02)
    assert S.brier_score([0.9], [0]) == pytest.approx(1.62)
    # HANS Noul check (acc .65, conf .93) ≈ 0.61 with the sum-over-classes convention
    p = np.r_[np.full(35, 0.07), np.full(65, 0.93)]  # P(true); gold = 1 → 35 errors
    assert S.brier_score(p, np.ones(100, int)) == pytest.approx(0.35 * 2 * 0.93**2 + 0.65 * 2 * 0.07**2)


def test_t4_e_aurc():
    conf, correct = [0.9, 0.8, 0.7, 0.6], [1, 0, 1, 1]
    c = S.e_aurc(conf, correct)
    d = S.e_aurc(conf, correct, optimum="discrete")
    assert c.aurc == pytest.approx(0.270833, abs=1e-6)
    assert d.aurc_optimal == pytest.approx(0.0625) and c.aurc_optimal == pytest.approx(0.034238, abs=1e-6)
    assert d.e_aurc == pytest.approx(0.208333, abs=1e-6) and c.e_aurc == pytest.approx(0.236595, abs=1e-6)
    assert S.e_aurc([0.5, 0.4], [1, 1]).e_aurc == 0.0


def test_t5_auroc_equivalence_and_top_label():
    rng = np.random.default_rng(1)
    P = rng.uniform(size=200)
    y = (rng.uniform(size=200) < P).astype(int)
    tl = S.top_label(P, y)
    a_p = S.selective_auroc(tl.correct, tl.confidence)
    assert a_p == S.selective_auroc(tl.correct, S.confidence_entropy(P))
    assert a_p == S.selective_auroc(tl.correct, S.confidence_margin(P))
    assert math.isnan(S.selective_auroc(np.ones(5), np.arange(5)))
    assert S.selective_auroc([1, 1, 0, 0], [0.9, 0.5, 0.5, 0.1]) == pytest.approx(0.875)  # ties count ½
    assert S.top_label([0.5], [1]).prediction.tolist() == [1]  # P ≥ 0.5 → true
    np.testing.assert_allclose(S.collapse_nli([[0.2, 0.5, 0.3]]), [[0.2, 0.8]])


def test_t6_interference():
    assert S.flip_rate(["A", "B", "C"], ["A", "C", "C"]) == pytest.approx(1 / 3)
    r = S.interference([0.6, 0.4], [0.4, 0.45])
    assert r.flip_rate == 0.5 and r.tv == pytest.approx(0.125)
    perm = S.permute_back([[0.7, 0.2, 0.1]], [2, 0, 1])  # shown order: C, A, B
    np.testing.assert_allclose(perm, [[0.2, 0.1, 0.7]])
    pooled = S.flip_rate(np.r_[np.zeros(300)], np.r_[np.ones(36), np.zeros(264)])
    assert pooled == 0.12
    # pooling check: 0.120 / 0.150 / 0.080 over three equal cohorts → 0.117
    a = np.zeros(900)
    b = np.r_[np.ones(36), np.zeros(264), np.ones(45), np.zeros(255), np.ones(24), np.zeros(276)]
    assert round(S.flip_rate(a, b), 3) == 0.117


def test_t7_clopper_pearson_and_guard():
    assert clopper_pearson(0, 125) == pytest.approx((0.0, 0.029080), abs=1e-6)
    assert clopper_pearson(1, 125) == pytest.approx((0.000203, 0.043767), abs=1e-6)
    assert clopper_pearson(12, 125) == pytest.approx((0.050595, 0.161689), abs=1e-6)
    # Tev1-0.8B consistency: 12 TP, 124 TN of 125 + 125 → acc .544, TPR .096, FPR .008
    y = np.r_[np.ones(125, bool), np.zeros(125, bool)]
    s = np.r_[np.full(12, 0.9), np.linspace(0.1, 0.4, 113), np.full(1, 0.6), np.linspace(0.0, 0.3, 124)]
    g = S.guard_metrics(y, s)
    assert (g.tpr, g.fpr, g.accuracy) == pytest.approx((0.096, 0.008, 0.544))
    assert g.fpr_ci == pytest.approx(clopper_pearson(1, 125))
    assert g.recall_at_zero_false_alarms == pytest.approx(12 / 125)  # only the 0.9 attacks beat the 0.6 benign
    perfect = S.guard_metrics([1, 1, 0, 0], [0.9, 0.8, 0.2, 0.1])
    assert perfect.auroc == 1.0 and perfect.pr_auc == 1.0 and perfect.recall_at_zero_false_alarms == 1.0
    assert S.recall_at_zero_false_alarms([1, 1, 0], [0.5, 0.7, 0.6]) == 0.5


def test_t11_stats_and_rates():
    w = S.paired_wilcoxon(np.arange(1, 11))
    assert w.p_value == pytest.approx(0.001953125, rel=1e-12)
    assert S.paired_wilcoxon(np.ones(28) + np.arange(28)).p_value == pytest.approx(2 / 2**28)
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]).p_adjusted, [0.03, 0.06, 0.06, 0.02])
    assert [round(100 * S.rate(k, 172), 1) for k in (58, 152, 157, 162, 166)] == [33.7, 88.4, 91.3, 94.2, 96.5]


def test_guard_and_ece_intervals_resample_base_items_when_given():
    """Inputs in clusters (issue 27): with ``groups`` the TPR/FPR and ECE intervals resample clusters. Ten items of
    ten identical traces carry the information of ten inputs, so the cluster interval is about √10 times wider
    than the Clopper–Pearson interval that counts 100 independent inputs."""
    rng = np.random.default_rng(4)
    hit_item = rng.random(20) < 0.5
    y = np.r_[np.ones(100, bool), np.zeros(100, bool)]
    s = np.where(np.repeat(hit_item, 10), 0.9, 0.1)
    items = np.repeat([f"i{k}" for k in range(20)], 10)
    flat = S.guard_metrics(y, s)
    clus = S.guard_metrics(y, s, groups=items, n_resamples=400, seed=0)
    assert clus.ci_unit.startswith("base item") and flat.ci_unit.startswith("input")
    assert (clus.tpr, clus.fpr) == (flat.tpr, flat.fpr)
    assert clus.tpr_ci[1] - clus.tpr_ci[0] > 2 * (flat.tpr_ci[1] - flat.tpr_ci[0])
    with pytest.raises(SiftError, match="groups"):
        S.guard_metrics(y, s, groups=items[:5])
    conf = np.repeat(rng.uniform(0.5, 1, 20), 10)
    correct = np.repeat(rng.random(20) < 0.7, 10).astype(float)
    a = S.ece_ci(conf, correct, n_resamples=200, seed=2)
    b = S.ece_ci(conf, correct, n_resamples=200, seed=2, groups=items)
    assert a.estimate == b.estimate and b.high - b.low > 2 * (a.high - a.low)
