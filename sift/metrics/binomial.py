"""Confidence bounds on a binomial proportion: the one place Clopper–Pearson and the Wald bound are written
(used by SGR, the selective-risk tables, the appendix bootstrap loops and the companion analyses).

Clopper–Pearson quantiles are ``scipy.special.betaincinv`` (the function ``scipy.stats.beta.ppf`` evaluates,
bit for bit). statsmodels' ``proportion_confint(method="beta")`` gives the same interval but computes the upper
end with ``beta.isf``, which differs from ``ppf(1 − q)`` by up to 3e-16; SGR compares the bound with α, so the
kernel keeps the ``ppf`` form the certificate was written with (a test checks the agreement with statsmodels).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import betaincinv
from scipy.stats import norm


def clopper_pearson_upper(successes: ArrayLike, n: ArrayLike, tail: float) -> np.ndarray:
    """One-sided exact upper bound U with P(p > U) ≤ ``tail``: Beta⁻¹(1 − tail; x + 1, n − x), and 1 where x = n.

    Vectorised over ``successes``/``n`` (n ≥ 1 each).
    """
    x, m = np.broadcast_arrays(np.asarray(successes, float), np.asarray(n, float))
    out = np.ones(x.shape)
    part = x < m
    out[part] = betaincinv(x[part] + 1, m[part] - x[part], 1.0 - tail)
    return out


def clopper_pearson_lower(successes: ArrayLike, n: ArrayLike, tail: float) -> np.ndarray:
    """One-sided exact lower bound L with P(p < L) ≤ ``tail``: Beta⁻¹(tail; x, n − x + 1), and 0 where x = 0."""
    x, m = np.broadcast_arrays(np.asarray(successes, float), np.asarray(n, float))
    out = np.zeros(x.shape)
    part = x > 0
    out[part] = betaincinv(x[part], m[part] - x[part] + 1, tail)
    return out


def clopper_pearson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Two-sided exact interval at ``level``: the one-sided bounds with tail (1 − level)/2 each."""
    a = 1.0 - level
    lo = clopper_pearson_lower(successes, n, a / 2)
    hi = clopper_pearson_upper(successes, n, a / 2)
    return float(lo), float(hi)


def wald_upper(successes: ArrayLike, n: ArrayLike, tail: float) -> np.ndarray:
    """Asymptotic upper bound p̂ + z_{1−tail}·sqrt(p̂(1 − p̂)/n) (paper eq. 34); it is 0 when p̂ = 0."""
    x, m = np.asarray(successes, float), np.asarray(n, float)
    r = x / m
    return r + norm.ppf(1.0 - tail) * np.sqrt(r * (1.0 - r) / m)
