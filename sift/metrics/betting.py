"""An upper confidence bound on a per-trace error rate when traces come in clusters (base items), by betting
(docs/design.md §7, "SGR"; Waudby-Smith & Ramdas 2024, *Estimating means of bounded random variables by
betting*, JRSS-B, predictable plug-in bets and Ville's inequality).

The independent unit is the base item. Item i contributes N_i selected traces with E_i errors (N_i ≤ M, the
most traces one item can hold). The per-trace risk is R = E[E_i] / E[N_i]. For r ∈ [0, 1) the scaled margin

    D_i(r) = (r·N_i − E_i) / ((1 − r)·M)   ∈ [−1, r / (1 − r)]

has mean 0 at r = R and grows with r (∂D/∂r = (N_i − E_i) / ((1 − r)²M) ≥ 0). Bets λ_i ∈ [0, c] (c < 1) that
depend only on earlier items make K_k(r) = Π_{i ≤ k} (1 + λ_i·D_i(r)) a positive martingale at r = R, so by
Ville's inequality P(max_k K_k(R) ≥ 1/δ) ≤ δ. K is nondecreasing in r, hence
U = inf{r : max_k K_k(r) ≥ 1/δ} is a (1 − δ) upper confidence bound on R, and U ≤ α iff max_k K_k(α) ≥ 1/δ.

Items are processed in a fixed order that does not depend on the data (a hash of the item name). The bets are
the predictable plug-in of Waudby-Smith & Ramdas (one-sided, fixed n), tuned on D(``tune_at``) and capped at
:data:`BET_CAP`; the same bets serve every r, which keeps K monotone in r.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
from numpy.typing import ArrayLike

from sift.errors import SiftError

#: cap c on the bets: a positive capital needs c < 1 (an item whose selected traces are all wrong has D = −1)
BET_CAP = 0.95
#: prior variance of the plug-in bets (Waudby-Smith & Ramdas use 1/4 for [0, 1] data)
PRIOR_VAR = 0.25
#: bisection steps for U (the interval halves each step: 2^-60 is far below any printed digit)
BISECTION_STEPS = 60


def item_order(names: ArrayLike) -> np.ndarray:
    """A data-independent processing order of items: by the BLAKE2b hash of each name (ties by name)."""
    s = [str(x) for x in np.asarray(names, dtype=object).tolist()]
    keys = [(hashlib.blake2b(x.encode(), digest_size=8).hexdigest(), x) for x in s]
    return np.array(sorted(range(len(s)), key=keys.__getitem__), dtype=np.int64)


def item_codes(groups: ArrayLike, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per trace the column of its item (columns in :func:`item_order`), and the item names in column order."""
    g = np.asarray(groups)
    if g.ndim != 1 or g.shape[0] != n:
        raise SiftError(f"groups must give one base item per trace ({n}), got shape {g.shape}")
    names, inverse = np.unique(g.astype(str), return_inverse=True)
    order = item_order(names)
    column = np.empty(names.size, dtype=np.int64)
    column[order] = np.arange(names.size)
    return column[np.asarray(inverse).reshape(-1)], names[order]


def item_counts(selected: np.ndarray, errors: np.ndarray, codes: np.ndarray, n_items: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """N [K, m] (selected traces per item) and E [K, m] (errors among them) for K selections ``selected`` [K, n]."""
    onehot = np.zeros((codes.size, n_items))
    onehot[np.arange(codes.size), codes] = 1.0
    sel = np.asarray(selected, dtype=float)
    return sel @ onehot, (sel * np.asarray(errors, dtype=float)[None, :]) @ onehot


def margins(n_sel: np.ndarray, n_err: np.ndarray, scale: float, r: float | np.ndarray) -> np.ndarray:
    """D_i(r) = (r·N_i − E_i) / ((1 − r)·M); ``r`` a scalar or one value per row."""
    r = np.asarray(r, dtype=float)
    if r.ndim:
        r = r[:, None]
    return (r * n_sel - n_err) / ((1.0 - r) * scale)


def plugin_bets(d: np.ndarray, delta: float, cap: float = BET_CAP) -> np.ndarray:
    """Predictable plug-in bets λ_i = min(c, sqrt(2 log(1/δ) / (m·σ̂²_{i−1}))) along the last axis of ``d``,
    σ̂²_{i−1} the running variance of the items before i (prior variance :data:`PRIOR_VAR`)."""
    d = np.atleast_2d(d)
    m = d.shape[-1]
    k = np.arange(m)  # items seen before position i
    s1 = np.concatenate([np.zeros(d.shape[:-1] + (1,)), np.cumsum(d, axis=-1)[..., :-1]], axis=-1)
    s2 = np.concatenate([np.zeros(d.shape[:-1] + (1,)), np.cumsum(d * d, axis=-1)[..., :-1]], axis=-1)
    mean = s1 / np.maximum(k, 1)
    var = (PRIOR_VAR + np.maximum(s2 - k * mean * mean, 0.0)) / (k + 1)
    return np.minimum(cap, np.sqrt(2.0 * math.log(1.0 / delta) / (m * var)))


def max_log_capital(n_sel: np.ndarray, n_err: np.ndarray, scale: float, bets: np.ndarray,
                    r: float | np.ndarray) -> np.ndarray:
    """max_k log K_k(r) per row (0 for an empty sample: the capital starts at 1)."""
    if n_sel.shape[-1] == 0:
        return np.zeros(n_sel.shape[0])
    steps = np.log1p(bets * margins(n_sel, n_err, scale, r))
    return np.maximum(np.max(np.cumsum(steps, axis=-1), axis=-1), 0.0)


def betting_bounds(n_sel: ArrayLike, n_err: ArrayLike, delta: float, scale: float, tune_at: float,
                   values: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Per row of item counts (N, E) [K, m] (items in processing order): the (1 − δ) upper bound U on the
    per-trace risk (NaN when ``values`` is False) and whether U ≤ ``tune_at`` (the test at α when
    ``tune_at = α``). U = 1 when no r < 1 is rejected; rows without a selected trace get U = 1, never ≤ α."""
    n = np.atleast_2d(np.asarray(n_sel, dtype=float))
    e = np.atleast_2d(np.asarray(n_err, dtype=float))
    if n.shape != e.shape:
        raise SiftError(f"item counts differ in shape: N {n.shape}, E {e.shape}")
    if np.any(e > n) or np.any(e < 0):
        raise SiftError("item counts: errors must lie between 0 and the selected traces")
    if not 0.0 < delta < 1.0 or not 0.0 < tune_at < 1.0:
        raise SiftError(f"delta and tune_at must lie in (0, 1), got {delta}, {tune_at}")
    if n.size and scale < n.max():
        raise SiftError(f"scale M = {scale} is below the largest item ({n.max():g} selected traces)")
    level = math.log(1.0 / delta)
    bets = plugin_bets(margins(n, e, scale, tune_at), delta) if n.shape[-1] else np.zeros(n.shape)
    passed = (max_log_capital(n, e, scale, bets, tune_at) >= level) & (n.sum(axis=-1) > 0)
    if not values:
        return np.full(n.shape[0], math.nan), passed
    top = 1.0 - 1e-12
    lo, hi = np.zeros(n.shape[0]), np.full(n.shape[0], top)
    never = max_log_capital(n, e, scale, bets, np.full(n.shape[0], top)) < level
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        rej = max_log_capital(n, e, scale, bets, mid) >= level
        hi = np.where(rej, mid, hi)
        lo = np.where(rej, lo, mid)
    upper = np.where(never | (n.sum(axis=-1) == 0), 1.0, hi)
    return np.where(passed, np.minimum(upper, tune_at), upper), passed
