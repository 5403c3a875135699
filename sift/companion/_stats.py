"""Small statistics shared by the companion-paper metrics (bootstrap, FDR/FWER, binomial CIs).

Everything here is a pure function of numpy arrays; randomness only through an explicit seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from statsmodels.stats.proportion import proportion_confint

from sift.errors import SiftError
from sift.metrics.binomial import clopper_pearson_interval


@dataclass(frozen=True)
class BootstrapCI:
    """Point estimate with a percentile-bootstrap interval."""

    estimate: float
    low: float
    high: float
    level: float
    n_resamples: int
    seed: int


def bootstrap_ci(
    statistic: Callable[[np.ndarray], float],
    n: int,
    *,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    groups=None,
) -> BootstrapCI:
    """Percentile bootstrap over ``n`` units (Efron 1979), via ``sift.metrics.cluster_bootstrap``.

    ``statistic(idx)`` receives an index array into the units (``arange(n)`` for the point estimate,
    resampled-with-replacement indices for the replicates), so paired/multi-array statistics (ECE,
    ΔECE, LDS) resample their arrays jointly. ``groups`` (length n) resamples whole clusters instead,
    e.g. several CoTs of one base item. NaN replicates are dropped.
    """
    from sift.metrics import cluster_bootstrap

    if n < 1:
        raise SiftError("bootstrap_ci: need at least one unit")
    g = np.arange(n) if groups is None else np.asarray(groups)
    r = cluster_bootstrap(statistic, g, n_resamples=n_resamples, seed=seed, confidence=level)
    return BootstrapCI(r.estimate, r.low, r.high, level, n_resamples, seed)


def bootstrap_mean_ci(values, *, n_resamples: int = 1000, level: float = 0.95, seed: int = 0,
                      groups=None) -> BootstrapCI:
    """Percentile bootstrap CI of the mean of ``values`` (NaNs dropped first). ``groups`` (one per value, e.g.
    the base item of each trace) resamples whole clusters: the unit of the interval."""
    v = np.asarray(values, dtype=float)
    keep = ~np.isnan(v)
    if groups is not None and len(groups) != v.size:
        raise SiftError(f"bootstrap_mean_ci: {len(groups)} groups for {v.size} values")
    g = None if groups is None else np.asarray(groups)[keep]
    v = v[keep]
    return bootstrap_ci(lambda idx: v[idx].mean(), v.size, n_resamples=n_resamples, level=level, seed=seed, groups=g)


@dataclass(frozen=True)
class MultipleTestResult:
    """Rejections and adjusted p-values, in the input order."""

    reject: np.ndarray
    p_adjusted: np.ndarray
    alpha: float
    method: str

    @property
    def rejection_rate(self) -> float:
        return float(np.mean(self.reject)) if self.reject.size else float("nan")


def benjamini_hochberg(pvalues, alpha: float = 0.10) -> MultipleTestResult:
    """Benjamini–Hochberg step-up FDR control (ICE §3, α = 0.10 by default).

    Reject 1..i* for the largest i with p_(i) ≤ iα/m; adjusted p̃_(i) = min_{j≥i} min(1, m p_(j)/j).
    Delegates to ``sift.metrics.benjamini_hochberg`` (same convention as statsmodels' 'fdr_bh';
    NaN p-values are left out of the family and never rejected).
    """
    from sift.metrics import benjamini_hochberg as _bh

    p = np.asarray(pvalues, dtype=float)
    if p.size == 0:
        return MultipleTestResult(np.zeros(0, bool), np.zeros(0), alpha, "fdr_bh")
    r = _bh(p, alpha)
    return MultipleTestResult(np.asarray(r.reject), np.asarray(r.p_adjusted), alpha, "fdr_bh")


def holm(pvalues, alpha: float = 0.05) -> MultipleTestResult:
    """Holm–Bonferroni step-down: p_adj(j) = min(1, max_{i≤j} (m−i+1) p_(i)) (System-1 paper §5.8)."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(pvalues, dtype=float)
    reject, p_adj, _, _ = multipletests(p, alpha=alpha, method="holm")
    return MultipleTestResult(np.asarray(reject), np.asarray(p_adj), alpha, "holm")


def clopper_pearson(x: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval [Beta⁻¹(α/2; x, n−x+1), Beta⁻¹(1−α/2; x+1, n−x)], 0/1 at the ends
    (``sift.metrics.binomial.clopper_pearson_interval``, after checking the counts). Valid only when the n units
    are independent; for clustered units (several traces of one base item) resample the clusters instead."""
    if n <= 0 or not 0 <= x <= n:
        raise SiftError(f"clopper_pearson: need 0 <= x <= n and n > 0, got x={x}, n={n}")
    return clopper_pearson_interval(x, n, level)


def wilson_interval(x: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (our extension for judge rates): statsmodels
    ``proportion_confint(method="wilson")``; NaN for n = 0. Valid only for independent units (the judge rates:
    one verdict per judge item, every item a distinct problem)."""
    if n <= 0:
        return float("nan"), float("nan")
    lo, hi = proportion_confint(x, n, alpha=1.0 - level, method="wilson")
    return float(max(0.0, lo)), float(min(1.0, hi))
