"""Selective guaranteed risk (SGR): certified abstention (paper Thm. 4.7, §6.1.3, App. K.5)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from sift.errors import SiftError
from sift.metrics.binomial import clopper_pearson_upper, wald_upper
from sift.metrics.checks import as_binary, as_finite, check_unit, same_length, undefined

#: Default candidate thresholds, fixed before seeing data: a grid over the range of ρ = max(s, 1−s).
DEFAULT_CANDIDATES = np.linspace(0.5, 1.0, 51)


def confidence_gate(scores: ArrayLike) -> np.ndarray:
    """Default gate ρ(c) = max(s, 1−s) for a detector probability s (docs/design.md §7)."""
    s = as_finite("scores", scores)
    return np.maximum(s, 1.0 - s)


@dataclass(frozen=True, eq=False)
class RiskCoverageCurve:
    """Per candidate threshold t (ascending): coverage n_t/n, empirical risk e_t/n_t (eq. 32, NaN if
    n_t = 0), the upper bound U(t), and n_t (eq. 33)."""

    thresholds: np.ndarray
    coverage: np.ndarray
    risk: np.ndarray
    bound: np.ndarray
    n_selected: np.ndarray


@dataclass(frozen=True, eq=False)
class SGRResult:
    """Chosen threshold t* and its calibration coverage, empirical selective risk and bound value.

    Infeasible (no candidate certified): ``feasible=False``, ``threshold=inf``, coverage 0, NaN risk
    and bound, and ``reason`` says why.
    """

    threshold: float
    coverage: float
    selective_risk: float
    bound_value: float
    n_selected: int
    feasible: bool
    reason: str
    curve: RiskCoverageCurve


def upper_bounds(errors: np.ndarray, n_sel: np.ndarray, delta_each: float, bound: str) -> np.ndarray:
    """One-sided (1 − δ') upper bounds on the selective error rate (:mod:`sift.metrics.binomial`); inf where
    n_t = 0. ``"clopper-pearson"``: exact (App. K.5); ``"normal"``: the Wald bound of eq. 34."""
    out = np.full(np.shape(errors), np.inf)
    has = n_sel > 0
    e, n = errors[has], n_sel[has]
    out[has] = clopper_pearson_upper(e, n, delta_each) if bound == "clopper-pearson" else wald_upper(e, n, delta_each)
    return out


def selection_counts(confidence: np.ndarray, errors: np.ndarray, thresholds: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """n_t (traces with ρ ≥ t) and e_t (errors among them) for every threshold t at once (eq. 33), by sorting ρ:
    O((n + K) log n)."""
    order = np.argsort(confidence, kind="mergesort")
    start = np.searchsorted(confidence[order], thresholds, side="left")  # first index with ρ ≥ t
    n_sel = (confidence.size - start).astype(np.int64)
    cum_err = np.concatenate([[0], np.cumsum(errors[order][::-1])])  # errors among the top j
    return n_sel, cum_err[n_sel].astype(np.int64)


def first_feasible(bounds: np.ndarray, alpha: float) -> int | None:
    """Index of the smallest candidate (candidates ascend) whose bound is ≤ α (eq. 35); None if none is."""
    ok = np.flatnonzero(bounds <= alpha)
    return int(ok[0]) if ok.size else None


def sgr(
    confidence: ArrayLike,
    correct: ArrayLike,
    alpha: float,
    delta: float,
    candidates: Sequence[float] | ArrayLike | None = None,
    bound: Literal["clopper-pearson", "normal"] = "clopper-pearson",
) -> SGRResult:
    """Certify a selection threshold t* = min{t ∈ 𝒯 : U(t) ≤ α} (paper eq. 35 / eq. 65).

    ``confidence`` is the gate ρ(c) (default choice: ``confidence_gate(scores)``); ``correct`` is
    1 where the verdict matches φ*. A trace is selected when ρ ≥ t. ``candidates`` 𝒯 must be fixed
    before seeing the calibration data (default ``DEFAULT_CANDIDATES`` = linspace(0.5, 1, 51)).
    δ is split uniformly, δ' = δ/|𝒯|, over *all* candidates (Bonferroni, eqs. 67–68), and every
    candidate is tested (no binary search, so a non-monotone bound cannot hide a feasible t).
    ``bound="clopper-pearson"`` (default): exact one-sided binomial bound, valid for every n
    (Thm. K.8); ``"normal"``: the asymptotic bound of eq. 34 (only valid for large n_t). The smallest
    feasible threshold has the largest coverage among certified candidates.
    """
    rho = as_finite("confidence", confidence)
    ok = as_binary("correct", correct)
    n = same_length(confidence=rho, correct=ok)
    check_unit("alpha", alpha, open_interval=True)
    check_unit("delta", delta, open_interval=True)
    if bound not in ("clopper-pearson", "normal"):
        raise SiftError(f"bound must be 'clopper-pearson' or 'normal', got {bound!r}")
    if candidates is None:
        ts = DEFAULT_CANDIDATES
    else:
        ts = np.unique(as_finite("candidates", np.atleast_1d(np.asarray(candidates, dtype=float))))
        if ts.size == 0:
            raise SiftError("candidates is empty")
    k = ts.size
    n_sel, e_sel = selection_counts(rho, 1 - ok, ts)
    with np.errstate(invalid="ignore", divide="ignore"):
        risk = np.where(n_sel > 0, e_sel / np.maximum(n_sel, 1), np.nan)
    ub = upper_bounds(e_sel, n_sel, delta / k, bound)
    coverage = n_sel / n if n else np.zeros(k)
    curve = RiskCoverageCurve(ts, coverage, risk, np.where(np.isinf(ub), np.nan, ub), n_sel)
    i = first_feasible(ub, alpha)
    if i is None:
        if n == 0:
            reason = "SGR infeasible: empty calibration set"
        else:
            best = np.nanmin(curve.bound) if np.isfinite(ub).any() else math.nan
            reason = (
                f"SGR infeasible: no candidate threshold has a {bound} bound <= alpha={alpha} "
                f"(delta'={delta / k:.3g} over {k} candidates, n={n}; smallest bound {best:.4g})"
            )
        undefined(reason)
        return SGRResult(math.inf, 0.0, math.nan, math.nan, 0, False, reason, curve)
    return SGRResult(
        threshold=float(ts[i]),
        coverage=float(coverage[i]),
        selective_risk=float(risk[i]),
        bound_value=float(ub[i]),
        n_selected=int(n_sel[i]),
        feasible=True,
        reason="",
        curve=curve,
    )


def select_top(confidence: ArrayLike, coverage: float) -> np.ndarray:
    """Boolean mask of the ⌈coverage·n⌉ traces with the highest gate ρ (coverage-matched selection, paper
    App. C.7.3). Ties in ρ are broken by position (stable sort), so exactly ⌈κn⌉ traces are kept."""
    rho = as_finite("confidence", confidence)
    check_unit("coverage", coverage)
    n = rho.size
    k = int(math.ceil(coverage * n - 1e-9))
    keep = np.zeros(n, dtype=bool)
    if k:
        keep[np.argsort(-rho, kind="mergesort")[:k]] = True
    return keep


def top_coverage_counts(confidence: np.ndarray, correct: np.ndarray, coverage: float) -> tuple[int, int]:
    """Kernel of the coverage-indexed selective risk: (errors, size) of the ⌈coverage·n⌉ most confident traces
    (:func:`select_top`); the risk is errors / size."""
    keep = select_top(confidence, coverage)
    n = int(keep.sum())
    return int(n - np.asarray(correct)[keep].sum()), n


def risk_at_coverage(confidence: ArrayLike, correct: ArrayLike, coverage: float) -> float:
    """Empirical selective risk (error rate) among the ⌈coverage·n⌉ most confident traces (:func:`select_top`).

    This is the coverage-indexed risk–coverage curve (the paper's Fig. 9 x-axis); no threshold is
    certified here, see :func:`sgr` for that. Zero selected traces: NaN with a warning.
    """
    ok = as_binary("correct", correct)
    rho = as_finite("confidence", confidence)
    same_length(confidence=rho, correct=ok)
    errors, n = top_coverage_counts(rho, ok, coverage)
    if n == 0:
        return undefined(f"selective risk undefined at coverage {coverage}: no trace selected")
    return errors / n


def risk_upper_bound(errors: int, n: int, delta: float, bound: Literal["clopper-pearson", "normal"] =
                     "clopper-pearson") -> float:
    """One-sided (1 − δ) upper confidence bound on an error rate from ``errors`` of ``n`` (the bound SGR uses)."""
    check_unit("delta", delta, open_interval=True)
    if bound not in ("clopper-pearson", "normal"):
        raise SiftError(f"bound must be 'clopper-pearson' or 'normal', got {bound!r}")
    if n <= 0:
        return undefined("risk bound undefined: no selected traces")
    ub = upper_bounds(np.array([errors]), np.array([n]), delta, bound)
    return float(ub[0])
