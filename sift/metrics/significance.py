"""Paired tests and multiplicity control: McNemar, its cluster-aware form (a sign-flip test over base items),
Benjamini–Hochberg (paper §7.1, docs/design.md §7)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from statsmodels.stats.contingency_tables import mcnemar as _sm_mcnemar
from statsmodels.stats.multitest import multipletests

from sift.errors import SiftError
from sift.metrics.checks import as_1d, as_binary, check_unit, same_length, undefined


@dataclass(frozen=True)
class McNemarResult:
    """``b`` = pairs only A gets right, ``c`` = pairs only B gets right; ``exact`` = binomial test used.

    ``statistic``: min(b, c) for the exact test (statsmodels' convention), else the
    continuity-corrected χ² = (|b − c| − 1)² / (b + c).
    """

    statistic: float
    p_value: float
    b: int
    c: int
    exact: bool
    reason: str = ""


def mcnemar(correct_a: ArrayLike, correct_b: ArrayLike, exact_below: int = 25) -> McNemarResult:
    """Paired McNemar test of two detectors on the same items (paper §7.1: IVR contrasts).

    Exact two-sided binomial test Binom(b + c, 1/2) when b + c < ``exact_below`` (25), else χ²(1)
    with continuity correction. Delegates to statsmodels; its exact p is 2·P(X ≤ min(b, c)) capped
    at 1, which for p = 1/2 equals the usual two-sided binomial p. No discordant pairs: p = 1.
    Empty input: NaN with a reason.
    """
    a, bb = as_binary("correct_a", correct_a), as_binary("correct_b", correct_b)
    n = same_length(correct_a=a, correct_b=bb)
    b = int(np.sum((a == 1) & (bb == 0)))
    c = int(np.sum((a == 0) & (bb == 1)))
    exact = b + c < exact_below or b + c == 0
    if n == 0:
        reason = "McNemar undefined: no paired items"
        undefined(reason)
        return McNemarResult(math.nan, math.nan, 0, 0, exact, reason)
    table = np.array([[0, b], [c, 0]])  # concordant cells do not enter the test
    res = _sm_mcnemar(table, exact=exact, correction=True)
    reason = "no discordant pairs: p = 1 by convention" if b + c == 0 else ""
    return McNemarResult(float(res.statistic), float(min(res.pvalue, 1.0)), b, c, exact, reason)


@dataclass(frozen=True)
class ClusteredPairedResult:
    """Sign-flip test over clusters: ``statistic`` = b − c (units only A gets right minus units only B gets right),
    ``n_items`` clusters with a paired unit, ``n_discordant_items`` of them with b_i ≠ c_i."""

    statistic: float
    p_value: float
    b: int
    c: int
    n_items: int
    n_discordant_items: int
    reason: str = ""


def sign_flip_distribution(diffs: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Exact null distribution of Σ ε_i·d_i over all 2^m sign vectors ε ∈ {±1}^m (integer d_i), by convolution:
    the support (ascending) and the probabilities."""
    d = np.abs(np.asarray(diffs, dtype=np.int64))
    total = int(d.sum())
    prob = np.zeros(2 * total + 1)
    prob[total] = 1.0
    for di in d[d > 0].tolist():
        shifted = np.zeros_like(prob)
        shifted[di:] += 0.5 * prob[:-di]
        shifted[:-di] += 0.5 * prob[di:]
        prob = shifted
    return np.arange(-total, total + 1), prob


def clustered_mcnemar(correct_a: ArrayLike, correct_b: ArrayLike, groups: ArrayLike) -> ClusteredPairedResult:
    """Paired test of two methods on the same units when the units come in clusters (e.g. the pairs of one base
    item): an exact sign-flip (permutation) test over clusters.

    Per cluster i, d_i = b_i − c_i (units only A gets right minus units only B gets right). Under H0 the two
    methods' outcomes are exchangeable within every cluster, so each d_i is symmetric about 0 and independent
    across clusters; the two-sided p-value is P(|Σ ε_i d_i| ≥ |Σ d_i|) over all sign vectors ε
    (:func:`sign_flip_distribution`, exact). With one unit per cluster it is the exact McNemar test. No
    discordant unit: p = 1. Empty input: NaN with a reason.
    """
    a, bb = as_binary("correct_a", correct_a), as_binary("correct_b", correct_b)
    n = same_length(correct_a=a, correct_b=bb)
    g = np.asarray(groups)
    if g.ndim != 1 or g.shape[0] != n:
        raise SiftError(f"groups must give one cluster per unit ({n}), got shape {g.shape}")
    if n == 0:
        reason = "clustered McNemar undefined: no paired units"
        undefined(reason)
        return ClusteredPairedResult(math.nan, math.nan, 0, 0, 0, 0, reason)
    _, code = np.unique(g.astype(str), return_inverse=True)
    code = np.asarray(code).reshape(-1)
    only_a, only_b = (a == 1) & (bb == 0), (a == 0) & (bb == 1)
    d = np.bincount(code, weights=only_a.astype(float)) - np.bincount(code, weights=only_b.astype(float))
    d = np.rint(d).astype(np.int64)
    t = int(d.sum())
    support, prob = sign_flip_distribution(d)
    p = float(prob[np.abs(support) >= abs(t)].sum()) if np.any(d) else 1.0
    reason = "" if np.any(d) else "no discordant units: p = 1 by convention"
    return ClusteredPairedResult(float(t), min(p, 1.0), int(only_a.sum()), int(only_b.sum()), int(code.max() + 1),
                                 int(np.count_nonzero(d)), reason)


@dataclass(frozen=True, eq=False)
class BHResult:
    """``reject[i]``: H_i rejected at FDR q; ``p_adjusted``: BH-adjusted p-values (NaN stays NaN)."""

    reject: np.ndarray
    p_adjusted: np.ndarray


def benjamini_hochberg(p_values: ArrayLike, q: float = 0.05) -> BHResult:
    """Benjamini–Hochberg step-up at FDR level q (paper §7.1: across axes / comparisons).

    Reject H_(1..k) for the largest k with p_(k) ≤ k·q/m. Adjusted p_(i) = min_{j≥i} m·p_(j)/j,
    capped at 1: statsmodels ``multipletests(method='fdr_bh')`` on the finite p-values, H_i rejected iff its
    adjusted p ≤ q (the same decision). NaN p-values are left out of the family (m counts finite ones only),
    never rejected, and reported with a warning.
    """
    p = as_1d("p_values", p_values)
    check_unit("q", q, open_interval=True)
    finite = ~np.isnan(p)
    if np.any((p[finite] < 0) | (p[finite] > 1)):
        raise SiftError("p_values must lie in [0, 1]")
    if not finite.all():
        undefined(f"BH: {int(np.sum(~finite))} NaN p-value(s) left out of the family")
    adjusted = np.full(p.shape, np.nan)
    if finite.any():
        adjusted[finite] = multipletests(p[finite], alpha=q, method="fdr_bh")[1]
    reject = np.zeros(p.shape, dtype=bool)
    reject[finite] = adjusted[finite] <= q
    return BHResult(reject=reject, p_adjusted=adjusted)
