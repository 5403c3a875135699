"""Bootstrap, McNemar, BH, kappas, ECE and the IVR bounds on hand/analytic cases."""

import math
from collections import Counter

import numpy as np
import pytest
from scipy.stats import chi2
from statsmodels.stats.multitest import multipletests

from sift.errors import SiftError
from sift.metrics import (
    UndefinedMetricWarning,
    benjamini_hochberg,
    cluster_bootstrap,
    clustered_mcnemar,
    cohen_kappa,
    ece,
    estimate_gamma,
    fleiss_kappa,
    gaussian_ivr_bound,
    ivr_lower_bound,
    mcnemar,
)
from sift.metrics.significance import sign_flip_distribution


def test_bootstrap_keeps_groups_whole():
    groups = np.array(["a", "b", "a", "c", "b", "a", "d"])  # group rows are not adjacent
    rows = {g: sorted(np.flatnonzero(groups == g)) for g in set(groups)}
    calls = []

    def record(idx):
        calls.append(idx.copy())
        return 0.0

    res = cluster_bootstrap(record, groups, n_resamples=100, seed=1)
    assert res.n_resamples == 100 and res.n_nan == 0 and len(calls) == 101
    np.testing.assert_array_equal(calls[0], np.arange(groups.size))  # the point estimate
    for idx in calls[1:]:  # every replicate is a concatenation of whole groups, 4 draws
        pos, draws = 0, 0
        while pos < idx.size:
            g = groups[idx[pos]]
            assert sorted(idx[pos : pos + len(rows[g])]) == rows[g]
            pos, draws = pos + len(rows[g]), draws + 1
        assert draws == 4
    assert any(Counter(groups[idx])["a"] == 6 for idx in calls[1:])  # a group drawn twice


def test_cluster_bootstrap_ci_pinned_on_a_hand_case():
    """Three items a = (1, 0), b = (1), c = (0, 0, 0); the statistic is the mean over the drawn rows.

    The engine draws, per replicate, as many item codes as there are items (a = 0, b = 1, c = 2, sorted) with
    ``default_rng(seed).integers(0, 3, size=3)``. With seed 2 the five draws, their rows and their means:
      (c, a, a): 0 0 0 1 0 1 0 → 2/7      (a, b, c): 1 0 1 0 0 0   → 1/3      (b, a, b): 1 1 0 1 → 3/4
      (b, c, c): 1 0 0 0 0 0 0 → 1/7      (c, a, c): 0 0 0 1 0 0 0 0 → 1/8
    (a mean of item means would give 1/3, 1/2, 5/6, 1/3, 1/6 instead). Sorted: 1/8, 1/7, 2/7, 1/3, 3/4. The
    95 % percentile interval interpolates linearly between order statistics at positions 0.025·4 = 0.1 and
    0.975·4 = 3.9: low = 1/8 + 0.1·(1/7 − 1/8) = 71/560, high = 1/3 + 0.9·(3/4 − 1/3) = 17/24."""
    groups = np.array(["a", "a", "b", "c", "c", "c"])
    x = np.array([1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    rng = np.random.default_rng(2)  # the generator's draws, as listed above
    assert [rng.integers(0, 3, size=3).tolist() for _ in range(5)] == [[2, 0, 0], [0, 1, 2], [1, 0, 1], [1, 2, 2],
                                                                         [2, 0, 2]]
    res = cluster_bootstrap(lambda idx: float(x[idx].mean()), groups, n_resamples=5, seed=2, keep_replicates=True)
    np.testing.assert_allclose(res.replicates, [2 / 7, 1 / 3, 3 / 4, 1 / 7, 1 / 8], rtol=1e-12)
    assert res.estimate == pytest.approx(1 / 3)
    assert res.low == pytest.approx(71 / 560, abs=1e-12) and res.high == pytest.approx(17 / 24, abs=1e-12)
    assert res.n_nan == 0


def test_bootstrap_nan_replicates_dropped_and_counted():
    groups = np.array([0, 1, 2, 3])
    x = np.array([1.0, 2.0, 3.0, 4.0])
    res = cluster_bootstrap(lambda idx: np.nan if 3 not in idx else x[idx].mean(), groups, 200, 0)
    expected_nan = 200 * (3 / 4) ** 4
    assert 0 < res.n_nan < 200 and abs(res.n_nan - expected_nan) < 40
    assert res.low <= res.high and res.estimate == pytest.approx(2.5)
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(cluster_bootstrap(lambda idx: np.nan, groups, 10).low)


def test_cluster_bootstrap_ci_covers_truth():
    """30 items × 10 rows with a strong item effect: the cluster CI covers μ ≈ 95 %, a row CI does not."""
    rng = np.random.default_rng(7)
    n_items, per, mu, trials = 30, 10, 0.3, 100
    groups = np.repeat(np.arange(n_items), per)
    cover_cluster = cover_rows = 0
    for t in range(trials):
        x = mu + np.repeat(rng.normal(0, 1, n_items), per) + rng.normal(0, 0.1, n_items * per)
        def stat(idx, x=x):
            return float(x[idx].mean())

        c = cluster_bootstrap(stat, groups, n_resamples=100, seed=t)
        r = cluster_bootstrap(stat, np.arange(x.size), n_resamples=100, seed=t)
        assert c.estimate == pytest.approx(x.mean())
        cover_cluster += c.low <= mu <= c.high
        cover_rows += r.low <= mu <= r.high
    assert cover_cluster / trials >= 0.85
    assert cover_rows / trials < 0.65  # expected ≈ 0.46: rows within an item are not independent


def test_mcnemar_exact_hand_case():
    # b = 1 (A right only), c = 5 (B right only), 4 concordant: p = 2·P(Bin(6, ½) ≤ 1) = 14/64
    a = [1, 0, 0, 0, 0, 0, 1, 1, 0, 0]
    b = [0, 1, 1, 1, 1, 1, 1, 1, 0, 0]
    r = mcnemar(a, b)
    assert (r.b, r.c, r.exact) == (1, 5, True)
    assert r.p_value == pytest.approx(0.21875) and r.statistic == 1


def test_mcnemar_chi_square_with_continuity_correction():
    a = [1] * 20 + [0] * 10 + [1] * 5
    b = [0] * 20 + [1] * 10 + [1] * 5
    r = mcnemar(a, b)
    assert (r.b, r.c, r.exact) == (20, 10, False)
    assert r.statistic == pytest.approx((10 - 1) ** 2 / 30)
    assert r.p_value == pytest.approx(chi2.sf(2.7, 1))


def test_mcnemar_degenerate():
    r = mcnemar([1, 0], [1, 0])
    assert r.p_value == 1.0 and r.reason
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(mcnemar([], []).p_value)


def test_clustered_mcnemar_hand_case():
    """Items A (two pairs only A keeps), B (one), C (one only B keeps), D (concordant): d = (+2, +1, −1, 0),
    T = b − c = 2. The 2³ sign flips of the discordant items give T* = ±2 ± 1 ± 1 ∈ {4, 2, 2, 0, 0, −2, −2, −4}:
    P(|T*| ≥ 2) = 6/8. Pair-level McNemar on the same b = 3, c = 1 says 2·P(Bin(4, ½) ≤ 1) = 10/16."""
    a = [1, 1, 1, 0, 1, 0]
    b = [0, 0, 0, 1, 1, 0]
    items = ["A", "A", "B", "C", "D", "D"]
    r = clustered_mcnemar(a, b, items)
    assert (r.b, r.c, r.statistic, r.n_items, r.n_discordant_items) == (3, 1, 2.0, 4, 3)
    assert r.p_value == 0.75
    assert mcnemar(a, b).p_value == pytest.approx(0.625)
    # three discordant pairs of one item are one draw: T* = ±3, p = 1 (McNemar on pairs: 2/8)
    one = clustered_mcnemar([1, 1, 1], [0, 0, 0], ["A"] * 3)
    assert one.p_value == 1.0 and mcnemar([1, 1, 1], [0, 0, 0]).p_value == pytest.approx(0.25)


def test_clustered_mcnemar_is_exact_mcnemar_with_one_pair_per_item():
    rng = np.random.default_rng(5)
    for _ in range(5):
        a, b = rng.integers(0, 2, 60), (rng.random(60) < 0.35).astype(int)
        assert clustered_mcnemar(a, b, np.arange(60)).p_value == pytest.approx(mcnemar(a, b, exact_below=10**6).p_value)


def test_clustered_mcnemar_null_distribution_and_degenerate_cases():
    support, prob = sign_flip_distribution([2, 1])
    assert dict(zip(support.tolist(), prob.tolist())) == {-3: 0.25, -2: 0, -1: 0.25, 0: 0, 1: 0.25, 2: 0, 3: 0.25}
    r = clustered_mcnemar([1, 0], [1, 0], ["a", "b"])
    assert r.p_value == 1.0 and r.reason
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(clustered_mcnemar([], [], []).p_value)
    with pytest.raises(SiftError, match="one cluster per unit"):
        clustered_mcnemar([1, 0], [0, 1], ["a"])


def test_bh_hand_case_and_statsmodels():
    r = benjamini_hochberg([0.01, 0.02, 0.03, 0.04, 0.5], q=0.10)
    np.testing.assert_array_equal(r.reject, [True, True, True, True, False])
    np.testing.assert_allclose(r.p_adjusted, [0.05, 0.05, 0.05, 0.05, 0.5])
    rng = np.random.default_rng(3)
    for q in (0.05, 0.2):
        p = np.r_[rng.uniform(0, 0.02, 8), rng.uniform(0, 1, 30)]
        ours = benjamini_hochberg(p, q)
        rej, adj, _, _ = multipletests(p, alpha=q, method="fdr_bh")
        np.testing.assert_array_equal(ours.reject, rej)
        np.testing.assert_allclose(ours.p_adjusted, adj)


def test_bh_nan_left_out():
    with pytest.warns(UndefinedMetricWarning, match="NaN"):
        r = benjamini_hochberg([0.01, np.nan, 0.04], q=0.05)
    np.testing.assert_array_equal(r.reject, [True, False, True])
    assert math.isnan(r.p_adjusted[1])


def test_cohen_kappa_hand_case():
    # p_o = 3/4, p_e = ½·¼ + ½·¾ = ½  ->  κ = ½
    assert cohen_kappa([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx(0.5)
    assert cohen_kappa([1, 0, 1], [1, 0, 1]) == pytest.approx(1.0)
    with pytest.warns(UndefinedMetricWarning, match="p_e = 1"):
        assert math.isnan(cohen_kappa([1, 1], [1, 1]))


def test_fleiss_kappa_hand_case():
    # P̄ = (1 + 1 + 0)/3, P_e = ½  ->  κ = (2/3 − ½)/½ = 1/3
    assert fleiss_kappa([[2, 0], [0, 2], [1, 1]]) == pytest.approx(1 / 3)
    assert fleiss_kappa([[0, 0], [1, 1], [0, 1]], kind="ratings") == pytest.approx(1 / 3)
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(fleiss_kappa([[1, 1], [1, 1]], kind="ratings"))
    with pytest.raises(SiftError, match="row sums"):
        fleiss_kappa([[2, 0], [0, 3]])


def test_ece_hand_binned():
    # four singleton bins (top-label): conf .95/.9/.7/.8, correct 1/0/1/0
    assert ece([0.95, 0.9, 0.3, 0.2], [1, 0, 0, 1]) == pytest.approx((0.05 + 0.9 + 0.3 + 0.8) / 4)
    # bin (0.7, 0.8]: acc ¾ vs conf 0.8 (4 items); bin (0.5, 0.6]: acc ½ vs 0.55 (2 items)
    probs, labels = [0.8] * 4 + [0.55] * 2, [1, 1, 1, 0, 1, 0]
    assert ece(probs, labels) == pytest.approx((4 * 0.05 + 2 * 0.05) / 6)
    # positive-class reliability, uniform vs 2 equal-mass bins
    p, y = [0.1, 0.2, 0.8, 0.9], [0, 1, 1, 1]
    assert ece(p, y, reliability="positive_class") == pytest.approx((0.1 + 0.8 + 0.2 + 0.1) / 4)
    q = ece(p, y, n_bins=2, strategy="quantile", reliability="positive_class")
    assert q == pytest.approx((2 * 0.35 + 2 * 0.15) / 4)
    assert ece([1.0, 0.95], [0, 1], reliability="positive_class") == pytest.approx(0.475)  # right-closed
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(ece([], []))


def test_gaussian_ivr_bound_values():
    assert round(gaussian_ivr_bound(0.1, 1.0), 4) == 0.0398
    assert round(gaussian_ivr_bound(0.5 * 2.0, 2.0), 4) == 0.1915
    assert round(gaussian_ivr_bound(3.0, 3.0), 4) == 0.3413
    with pytest.raises(SiftError, match="sigma"):
        gaussian_ivr_bound(0.5, 0.0)


def test_ivr_lower_bound_hand_and_simulation():
    r = ivr_lower_bound([0.1, -0.2, 0.5, -1.0], [0.2, 0.1, -0.6, 0.5], sigma=1.0)
    assert r.empirical == pytest.approx(0.25)  # |m| <= |γΔ| for pairs 0 and 2
    assert r.gaussian == pytest.approx(np.mean([gaussian_ivr_bound(b, 1) for b in (0.2, 0.1, 0.6, 0.5)]))
    # Gaussian margins with a constant band: the flip rate matches ½·erf(b/(√2σ)) (spec §5.9)
    rng = np.random.default_rng(0)
    m = rng.normal(0, 1, 100_000)
    d = 0.5 * rng.choice([-1.0, 1.0], m.size)
    flip = np.mean(np.signbit(m) != np.signbit(m + d))
    est = ivr_lower_bound(m, d)
    assert est.sigma == pytest.approx(1.0, abs=0.01)
    assert est.gaussian == pytest.approx(0.1915, abs=0.003)
    assert flip == pytest.approx(est.gaussian, abs=0.006)
    assert est.empirical == pytest.approx(est.gaussian, abs=0.006)


def test_estimate_gamma():
    d = np.array([-1.0, 0.5, 2.0, 0.0, 1.0])
    dm = 2.0 * d
    assert estimate_gamma(dm, d) == pytest.approx(2.0)
    dm_outlier = dm.copy()
    dm_outlier[2] = 40.0
    assert estimate_gamma(dm_outlier, d, method="median_ratio") == pytest.approx(2.0)
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(estimate_gamma([0.1, 0.2], [0.0, 0.0]))
    with pytest.raises(SiftError, match="displacement"):
        estimate_gamma([0.1, 0.2], [1.0])
