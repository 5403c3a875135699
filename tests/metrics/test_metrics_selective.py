"""SGR on a hand-enumerated case (both bounds) and a coverage simulation (paper Thm. K.8)."""

import math
import warnings

import numpy as np
import pytest
from scipy.stats import binom

from sift.errors import SiftError
from sift.metrics import UndefinedMetricWarning, confidence_gate, sgr

# 30 traces at ρ=0.95 (all correct), 10 at 0.85 (all correct), 10 at 0.75 and 10 at 0.65 (half wrong)
RHO = np.r_[[0.95] * 30, [0.85] * 10, [0.75] * 10, [0.65] * 10]
OK = np.r_[[1] * 40, [1, 0] * 5, [1, 0] * 5]
CANDS = [0.6, 0.7, 0.8, 0.9]
GRID_51 = np.linspace(0.5, 1.0, 51)  # the paper's grid  # K = 4, delta = 0.2 -> delta' = 0.05
# per candidate: n_t = 60, 50, 40, 30; e_t = 10, 5, 0, 0


def test_curve_counts():
    res = sgr(RHO, OK, 0.3, 0.2, CANDS, bound="clopper-pearson")
    np.testing.assert_array_equal(res.curve.n_selected, [60, 50, 40, 30])
    np.testing.assert_allclose(res.curve.coverage, [1.0, 50 / 60, 40 / 60, 30 / 60])
    np.testing.assert_allclose(res.curve.risk, [10 / 60, 5 / 50, 0.0, 0.0])


def test_clopper_pearson_hand_enumeration():
    # e = 0: U = 1 - delta'^(1/n): t=0.9 -> 0.0950, t=0.8 -> 0.0722
    u90, u80 = 1 - 0.05 ** (1 / 30), 1 - 0.05 ** (1 / 40)
    bounds = sgr(RHO, OK, 0.3, 0.2, CANDS, bound="clopper-pearson").curve.bound
    assert bounds[3] == pytest.approx(u90) and bounds[2] == pytest.approx(u80)
    # e > 0: U solves P(Bin(n, U) <= e) = delta'
    assert binom.cdf(5, 50, bounds[1]) == pytest.approx(0.05, abs=1e-6)  # U ≈ 0.1988
    assert binom.cdf(10, 60, bounds[0]) == pytest.approx(0.05, abs=1e-6)  # U ≈ 0.2663
    # alpha=0.08: only t=0.8 is feasible (0.9 is not: bound 0.095, fewer traces) -> non-monotone
    r = sgr(RHO, OK, 0.08, 0.2, CANDS, bound="clopper-pearson")
    assert (r.threshold, r.n_selected, r.selective_risk, r.feasible) == (0.8, 40, 0.0, True)
    assert r.coverage == pytest.approx(2 / 3) and r.bound_value == pytest.approx(u80)
    assert sgr(RHO, OK, 0.25, 0.2, CANDS, bound="clopper-pearson").threshold == 0.7
    r = sgr(RHO, OK, 0.3, 0.2, CANDS, bound="clopper-pearson")
    assert (r.threshold, r.coverage) == (0.6, 1.0)


def test_normal_bound_hand_enumeration():
    z = 1.6448536269514722  # z_{0.95}
    u70 = 0.1 + z * math.sqrt(0.1 * 0.9 / 50)  # 0.1698
    u60 = 1 / 6 + z * math.sqrt((1 / 6) * (5 / 6) / 60)  # 0.2458
    b = sgr(RHO, OK, 0.3, 0.2, CANDS, bound="normal").curve.bound
    np.testing.assert_allclose(b, [u60, u70, 0.0, 0.0])  # Wald bound collapses at zero errors
    assert sgr(RHO, OK, 0.05, 0.2, CANDS, bound="normal").threshold == 0.8
    r = sgr(RHO, OK, 0.2, 0.2, CANDS, bound="normal")
    assert (r.threshold, r.selective_risk) == (0.7, pytest.approx(0.1))
    assert sgr(RHO, OK, 0.25, 0.2, CANDS, bound="normal").threshold == 0.6


def test_infeasible_reports_reason():
    with pytest.warns(UndefinedMetricWarning, match="infeasible"):
        r = sgr(RHO, OK, 0.05, 0.2, CANDS, bound="clopper-pearson")
    assert not r.feasible and r.threshold == math.inf and r.coverage == 0.0
    assert math.isnan(r.selective_risk) and r.n_selected == 0 and "alpha=0.05" in r.reason
    with pytest.warns(UndefinedMetricWarning, match="empty"):
        assert not sgr([], [], 0.1, 0.1, groups=[]).feasible


def test_bad_inputs():
    with pytest.raises(SiftError, match="correct"):
        sgr([0.9, 0.8], [1], 0.1, 0.1)
    with pytest.raises(SiftError, match="alpha"):
        sgr([0.9], [1], 1.5, 0.1)
    with pytest.raises(SiftError, match="bound"):
        sgr([0.9], [1], 0.1, 0.1, bound="hoeffding")


def test_confidence_gate():
    np.testing.assert_allclose(confidence_gate([0.1, 0.5, 0.8]), [0.9, 0.5, 0.8])


def test_clopper_pearson_certificate_holds_in_simulation():
    """ρ ~ U(0.5, 1), P(error | ρ) = 1 − ρ, so the true selective risk is R(t) = (1 − t)/2."""
    rng = np.random.default_rng(12345)
    reps, n, alpha, delta = 500, 1000, 0.12, 0.1
    rho = rng.uniform(0.5, 1.0, (reps, n))
    correct = (rng.uniform(size=(reps, n)) >= 1.0 - rho).astype(int)
    violations = feasible = naive_violations = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        for r in range(reps):
            res = sgr(rho[r], correct[r], alpha, delta, GRID_51, "clopper-pearson")  # independent traces
            if res.feasible:
                feasible += 1
                violations += (1.0 - res.threshold) / 2.0 > alpha
            # uncertified selection on the empirical risk alone, for contrast
            c = res.curve
            ok = np.flatnonzero(c.risk <= alpha)
            naive_violations += ok.size > 0 and (1.0 - c.thresholds[ok[0]]) / 2.0 > alpha
    assert feasible >= reps // 2  # the check is not vacuous
    assert violations / reps <= delta
    assert naive_violations / reps > delta  # the simulation can detect an invalid rule
