"""Small pure helpers for the appendix analyses (sift.evaluation.appendix*): the vector-valued front-end of the
cluster bootstrap, partial correlation, bootstrap p-values and the expected-cost curve of paper eq. 43."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from sift.errors import SiftError
from sift.metrics.bootstrap import ClusterRows, bootstrap_drawn, bootstrap_p_value
from sift.metrics.checks import UndefinedMetricWarning
from sift.metrics.operating import coverage_threshold


@dataclass(frozen=True, eq=False)
class BootstrapMany:
    """Point estimates on the full data and percentile CIs, one per component of the statistic."""

    estimate: np.ndarray
    low: np.ndarray
    high: np.ndarray
    replicates: np.ndarray  # [n_resamples, k]
    n_nan: np.ndarray

    def p_value(self, null: float = 0.0) -> np.ndarray:
        """Two-sided bootstrap p-value of H0: component = ``null`` (CI inversion: 2·min tail share).

        Floored at 1/(valid replicates + 1); NaN where every replicate is NaN.
        """
        return np.array([bootstrap_p_value(self.replicates[:, j], null, floor=True)
                         for j in range(self.estimate.size)], dtype=float).reshape(self.estimate.shape)


def cluster_bootstrap_many(
    statistic: Callable[[np.ndarray], ArrayLike],
    groups: ArrayLike,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> BootstrapMany:
    """:func:`sift.metrics.cluster_bootstrap` for a vector-valued statistic (same engine and draws).

    ``statistic(idx)`` returns a 1-D array of k numbers computed on rows ``idx``; every replicate draws
    as many base items as there are, with replacement, and passes the concatenated rows of the drawn
    items (a group drawn twice appears twice). Computing all components from one set of replicates keeps
    their joint distribution (differences of cells, shares of effects) coherent and costs one loop.
    NaN replicates of a component are dropped from that component's percentiles and counted.
    """
    g = np.asarray(groups)
    if g.ndim != 1 or g.size == 0:
        raise SiftError(f"groups must be a non-empty 1-D array, got shape {g.shape}")
    if n_resamples < 1:
        raise SiftError(f"n_resamples must be >= 1, got {n_resamples}")
    index = ClusterRows.of_labels(g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        est, reps, low, high = bootstrap_drawn(lambda drawn: statistic(index.rows(drawn)), index.n_clusters,
                                               n_resamples, seed, confidence)
    return BootstrapMany(est, low, high, reps, np.isnan(reps).sum(axis=0))


def partial_correlation(x: ArrayLike, y: ArrayLike, controls: ArrayLike | None) -> float:
    """Pearson correlation of x and y after removing (OLS with intercept) the linear effect of ``controls``.

    ``controls`` is [n, k] (or None / k = 0: the plain Pearson correlation). NaN when a residual is constant.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    if controls is not None and np.size(controls):
        z = np.asarray(controls, float).reshape(len(x), -1)
        design = np.column_stack([np.ones(len(x)), z])
        beta_x, *_ = np.linalg.lstsq(design, x, rcond=None)
        beta_y, *_ = np.linalg.lstsq(design, y, rcond=None)
        x, y = x - design @ beta_x, y - design @ beta_y
    return pearson(x, y)


def pearson(x: ArrayLike, y: ArrayLike) -> float:
    """Pearson correlation; NaN (no warning) when either input is constant or has fewer than 2 rows."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.size < 2:
        return math.nan
    xc, yc = x - x.mean(), y - y.mean()
    den = math.sqrt(float(np.dot(xc, xc)) * float(np.dot(yc, yc)))
    if den <= 1e-12 * max(1.0, float(np.abs(xc).max(initial=0)) * float(np.abs(yc).max(initial=0))):
        return math.nan
    return float(np.dot(xc, yc) / den)


def expected_cost_curve(
    confidence: ArrayLike,
    verdict: ArrayLike,
    label: ArrayLike,
    coverages: ArrayLike,
    c_fn: float,
    c_fp: float,
    c_abstain: float,
    base_rate: float | None = None,
) -> np.ndarray:
    """Expected cost per trace at each coverage κ (paper eq. 43, App. C.7.4).

    E[Cost](κ) = κ·[π·FNR(κ)·C_FN + (1−π)·FPR(κ)·C_FP] + (1−κ)·C_A, where the committed set at κ is the
    traces a coverage-κ operating point certifies (ρ ≥ the ⌈κn⌉-th largest ρ, ties included:
    :mod:`sift.metrics.operating`), the positive class of the *cost* is "unfaithful"
    (label 0): a false negative is a committed unfaithful trace judged faithful (verdict 1, label 0),
    FNR(κ) = FN/#unfaithful committed, FPR(κ) = FP/#faithful committed (0 when the committed set has none
    of that class), and π is the unfaithful base rate (default: the empirical share of label 0 over all
    traces; the paper assumes π = 0.4). κ = 0 costs C_A.
    """
    rho = np.asarray(confidence, float)
    v, y = np.asarray(verdict, int), np.asarray(label, int)
    n = rho.size
    pi = float(np.mean(y == 0)) if base_rate is None else float(base_rate)
    order = np.argsort(-rho, kind="mergesort")
    fn = np.concatenate([[0], np.cumsum(((v == 1) & (y == 0))[order])])
    fp = np.concatenate([[0], np.cumsum(((v == 0) & (y == 1))[order])])
    neg = np.concatenate([[0], np.cumsum((y == 0)[order])])
    pos = np.concatenate([[0], np.cumsum((y == 1)[order])])
    out = np.empty(len(np.atleast_1d(coverages)))
    desc = rho[order]
    for i, kappa in enumerate(np.atleast_1d(np.asarray(coverages, float))):
        # the committed set is a prefix of the descending order: ρ ≥ t_κ, ties with t_κ included
        k = int(np.sum(desc >= coverage_threshold(desc, kappa))) if n and kappa > 0 else 0
        fnr = fn[k] / neg[k] if neg[k] else 0.0
        fpr = fp[k] / pos[k] if pos[k] else 0.0
        out[i] = kappa * (pi * fnr * c_fn + (1.0 - pi) * fpr * c_fp) + (1.0 - kappa) * c_abstain
    return out
