"""SGR as a certificate (docs/design.md §7, paper Thm. 4.7): with a *fitted* detector, its decision threshold
chosen on a selection split and SGR calibrated on a disjoint calibration split, the test selective risk stays ≤ α
in at least 1 − δ of repeated experiments."""

import warnings

import numpy as np
from sklearn.linear_model import LogisticRegression

from sift.detectors.thresholds import fit_threshold
from sift.metrics import UndefinedMetricWarning, confidence_gate, sgr

ALPHA, DELTA, REPS = 0.15, 0.05, 500
W = np.array([2.0, -1.5, 1.0, 0.0, 0.0])


def _draw(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A logistic model with label noise: the Bayes error is about 0.18, so certifying α = 0.15 needs abstention."""
    x = rng.normal(size=(n, W.size))
    y = (rng.random(n) < 1 / (1 + np.exp(-(x @ W)))).astype(int)
    return x, y


def test_sgr_on_a_disjoint_calibration_split_certifies_test_risk():
    rng = np.random.default_rng(12)
    x_te, y_te = _draw(rng, 20_000)  # the deployment distribution, large enough that its risk ≈ the true risk
    risks, covs, feasible = [], [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        for _ in range(REPS):
            x_tr, y_tr = _draw(rng, 300)
            x_sel, y_sel = _draw(rng, 150)  # selection part: the decision threshold
            x_cal, y_cal = _draw(rng, 500)  # calibration part: SGR only
            lr = LogisticRegression(C=1.0).fit(x_tr, y_tr)
            thr = fit_threshold(lr.predict_proba(x_sel)[:, 1], y_sel, "youden")
            s_cal = lr.predict_proba(x_cal)[:, 1]
            # independent draws: every trace is its own base item
            res = sgr(confidence_gate(s_cal), (s_cal >= thr).astype(int) == y_cal, ALPHA, DELTA, groups=np.arange(500))
            if not res.feasible:  # certifies nothing: no selected test trace, no violated guarantee
                risks.append(0.0)
                covs.append(0.0)
                continue
            feasible += 1
            s_te = lr.predict_proba(x_te)[:, 1]
            keep = confidence_gate(s_te) >= res.threshold
            risks.append(float(np.mean((s_te[keep] >= thr).astype(int) != y_te[keep])) if keep.any() else 0.0)
            covs.append(float(keep.mean()))
    risks = np.array(risks)
    assert feasible >= 0.9 * REPS                       # the certificate is not vacuous ...
    assert np.mean(covs) > 0.2                         # ... and selects a real share of the traces
    assert np.mean(risks <= ALPHA) >= 1 - DELTA        # the guarantee: P(risk ≤ α) ≥ 1 − δ
    # without abstention the same detectors are far above α: the certificate is doing the work
    lr = LogisticRegression(C=1.0).fit(*_draw(rng, 300))
    assert np.mean(lr.predict(x_te) != y_te) > ALPHA
