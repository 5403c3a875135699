"""Invariance-violation lower bound (paper Thm. 4.6, Cor. 6.1 eq. 30 / K.6 eq. 59, App. I eq. 49)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import erf

from sift.errors import SiftError
from sift.metrics.checks import as_finite, same_length, undefined


def gaussian_ivr_bound(b: float, sigma: float) -> float:
    """½·erf(b/(√2σ)) (paper eq. 30 / eq. 59): IVR floor for margins m ~ N(0, σ²), band b = γ|Δ|.

    E.g. b = 0.5σ → 0.1915, b = σ → 0.3413.
    """
    b, sigma = float(b), float(sigma)
    if not sigma > 0:
        raise SiftError(f"sigma must be > 0, got {sigma}")
    if not b >= 0:
        raise SiftError(f"b (the band γ|Δ|) must be >= 0, got {b}")
    return 0.5 * math.erf(b / (math.sqrt(2.0) * sigma))


def ivr_floor(margins: np.ndarray, band: np.ndarray, sigma: float) -> tuple[float, float]:
    """Kernel of the IVR floor (Thm. 4.6): (½·E[erf(b/(√2σ))] (eq. 30, NaN unless σ > 0), ½·P̂[|m| ≤ b] (eq. 12)),
    margins m and bands b ≥ 0 per pair. No checks."""
    empirical = 0.5 * float(np.mean(np.abs(margins) <= band))
    gaussian = 0.5 * float(np.mean(erf(band / (math.sqrt(2.0) * sigma)))) if sigma > 0 else math.nan
    return gaussian, empirical


def slope_through_origin(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of y on x without intercept, x·y / x·x (the local sensitivity γ of eq. 10); NaN when
    x·x = 0."""
    den = float(np.dot(x, x))
    return float(np.dot(x, y)) / den if den > 0 else math.nan


@dataclass(frozen=True)
class IVRLowerBound:
    """``gaussian`` = ½·E[erf(γ|Δ|/(√2σ))] (eq. 30 averaged over pairs); ``empirical`` =
    ½·P̂[|m| ≤ γ|Δ|] (eq. 12, plug-in over pairs); ``sigma`` used; ``n`` pairs."""

    gaussian: float
    empirical: float
    sigma: float
    n: int


def ivr_lower_bound(
    margins: ArrayLike, gamma_delta: ArrayLike, sigma: float | None = None
) -> IVRLowerBound:
    """Lower bound on IVR from margins m(c) = D(c) − τ and bands γΔ (paper Thm. 4.6, App. I).

    ``margins[i]`` and ``gamma_delta[i]`` belong to the same preserving pair (|γΔ| is used).
    σ defaults to the sample standard deviation (ddof = 1) of ``margins``; the Gaussian form assumes
    m ~ N(0, σ²) (Cor. 6.1), the empirical form uses the observed margins and no Gaussian assumption.
    Fewer than 2 pairs without a given σ, or σ = 0: NaN with a warning.
    """
    m, gd = as_finite("margins", margins), np.abs(as_finite("gamma_delta", gamma_delta))
    n = same_length(margins=m, gamma_delta=gd)
    if n == 0:
        nan = undefined("IVR lower bound undefined: no pairs")
        return IVRLowerBound(nan, nan, nan, 0)
    if sigma is None:
        sigma = float(np.std(m, ddof=1)) if n > 1 else math.nan
    sigma = float(sigma)
    gaussian, empirical = ivr_floor(m, gd, sigma)
    if not sigma > 0:
        undefined(f"Gaussian IVR bound undefined: sigma = {sigma} (need > 0)")
    return IVRLowerBound(gaussian, empirical, sigma, n)


def estimate_gamma(
    margin_shift: ArrayLike,
    displacement: ArrayLike,
    method: Literal["slope", "median_ratio"] = "slope",
) -> float:
    """Local sensitivity γ in D(c') − D(c) = γΔ + r(Δ) (paper eq. 10 / eq. 49) from preserving pairs.

    ``margin_shift`` = D(c') − D(c); ``displacement`` = Δ = s(c') − s(c) (standardised feature change).
    ``"slope"``: least-squares slope through the origin Σ Δ·dD / Σ Δ² (signed; the bound uses |γ|).
    ``"median_ratio"``: median of |dD| / |Δ| over pairs with Δ ≠ 0 (robust to outliers, ≥ 0).
    All Δ = 0: NaN with a warning.
    """
    dm, d = as_finite("margin_shift", margin_shift), as_finite("displacement", displacement)
    same_length(margin_shift=dm, displacement=d)
    nz = d != 0
    if not nz.any():
        return undefined("gamma undefined: every displacement is 0")
    if method == "slope":
        return slope_through_origin(d, dm)
    if method == "median_ratio":
        return float(np.median(np.abs(dm[nz]) / np.abs(d[nz])))
    raise SiftError(f"method must be 'slope' or 'median_ratio', got {method!r}")
