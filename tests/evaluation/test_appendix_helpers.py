"""Pure helpers of the appendix analyses (sift.metrics.appendix_helpers), against hand-computed values."""

import math

import numpy as np
import pytest

from sift.metrics import cluster_bootstrap, sgr
from sift.metrics.appendix_helpers import cluster_bootstrap_many, expected_cost_curve, partial_correlation, pearson
from sift.metrics.operating import coverage_threshold
from sift.metrics.selective import SelectiveConfig


def test_coverage_threshold_is_the_ceil_kappa_n_th_largest():
    rho = [0.5, 0.9, 0.7, 0.8, 0.6]
    assert coverage_threshold(rho, 0.6) == 0.7  # ⌈3⌉-th largest
    assert coverage_threshold(rho, 0.5) == 0.7  # ⌈2.5⌉ = 3
    assert coverage_threshold(rho, 0.2) == 0.9
    assert coverage_threshold(rho, 1.0) == 0.5
    assert coverage_threshold([], 0.5) == math.inf


def test_vector_bootstrap_matches_the_scalar_one():
    rng = np.random.default_rng(1)
    x = rng.normal(size=40)
    groups = np.repeat(np.arange(10), 4)
    many = cluster_bootstrap_many(lambda i: np.array([x[i].mean(), 2.0]), groups, n_resamples=50, seed=3)
    one = cluster_bootstrap(lambda i: float(x[i].mean()), groups, n_resamples=50, seed=3)
    assert many.estimate[0] == pytest.approx(x.mean())
    assert (many.low[0], many.high[0]) == pytest.approx((one.low, one.high))
    assert many.low[1] == many.high[1] == 2.0
    assert many.replicates.shape == (50, 2)
    # bootstrap p-value: a component far from 0 gets the floor 1/(n+1); a constant 0 gets 1
    assert many.p_value()[1] == pytest.approx(1 / 51)
    zero = cluster_bootstrap_many(lambda i: np.array([0.0]), groups, n_resamples=10)
    assert zero.p_value()[0] == 1.0


def test_selective_threshold_equals_sgr_for_every_bound():
    rng = np.random.default_rng(0)
    for trial in range(6):
        n = int(rng.integers(20, 400))
        rho = rng.uniform(0.5, 1.0, n)
        correct = (rng.uniform(size=n) < rho ** (1 + trial)).astype(int)
        items = rng.integers(0, max(n // 8, 2), n)
        for alpha in (0.05, 0.2, 0.4):
            for bound in ("betting", "clopper-pearson", "normal"):
                ref = sgr(rho, correct, alpha, 0.05, bound=bound, groups=items)
                cfg = SelectiveConfig(alpha, 0.05, bound)
                assert cfg.threshold(rho, correct, items) == ref.threshold == cfg.run(rho, correct, items).threshold


def test_partial_correlation_removes_the_control():
    z = np.array([0, 0, 1, 1.0])
    x = z + np.array([1, -1, 1, -1.0])  # residual on z: [1, -1, 1, -1]
    y = 2 * z + np.array([1, -1, -1, 1.0])  # residual on z: [1, -1, -1, 1]
    assert pearson(x, y) > 0.3
    assert partial_correlation(x, y, z[:, None]) == pytest.approx(0.0, abs=1e-12)
    assert partial_correlation(x, y, None) == pytest.approx(pearson(x, y))
    assert math.isnan(pearson([1, 1, 1], [0, 1, 2]))


def test_expected_cost_eq_43_by_hand():
    # ρ order 1 > 2 > 3 > 4; trace 3 is a false negative (verdict faithful, label unfaithful), 4 a false positive
    rho, v, y = [0.9, 0.8, 0.7, 0.6], [1, 0, 1, 0], [1, 0, 0, 1]
    c = expected_cost_curve(rho, v, y, [0.0, 0.5, 0.75, 1.0], c_fn=10, c_fp=1, c_abstain=2)
    # π = 1/2. κ=0: C_A. κ=.5: no error → .5·2. κ=.75: FNR=1/2, FPR=0 → .75·(.5·.5·10)+.25·2.
    # κ=1: FNR = FPR = 1/2 → .5·.5·10 + .5·.5·1
    assert c == pytest.approx([2.0, 1.0, 2.375, 2.75])
    c4 = expected_cost_curve(rho, v, y, [1.0], c_fn=10, c_fp=1, c_abstain=2, base_rate=0.4)
    assert c4 == pytest.approx([0.4 * 0.5 * 10 + 0.6 * 0.5 * 1])


def test_error_bars_never_negative_and_keep_a_zero_bound():
    """A percentile interval that excludes its estimate gives a bar of length 0 on that side (matplotlib refuses
    negative lengths: the tiny crash-matrix job's report died on it); a bound of 0.0 is a bound, not a missing one;
    None is NaN."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from sift.evaluation.appendix_common import error_bars

    est, err = error_bars([{"estimate": 0.5, "low": 0.6, "high": 0.9}, {"estimate": 0.4, "low": 0.0, "high": 0.5},
                           {"estimate": None, "low": None, "high": None}])
    np.testing.assert_allclose(est, [0.5, 0.4, np.nan])
    np.testing.assert_allclose(err, [[0.0, 0.4, np.nan], [0.4, 0.1, np.nan]])
    fig, ax = plt.subplots()
    ax.bar(range(3), est, yerr=err)  # accepted
    ax.errorbar(est[0], est[0], xerr=err[:, :1], yerr=err[:, :1])
    plt.close(fig)
