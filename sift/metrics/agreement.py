"""Inter-rater / inter-detector agreement: Cohen's and Fleiss' κ (paper App. U.2, docs/design.md §7)."""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from sklearn.metrics import cohen_kappa_score
from statsmodels.stats import inter_rater

from sift.errors import SiftError
from sift.metrics.checks import as_1d, same_length, undefined


def cohen_kappa(a: ArrayLike, b: ArrayLike) -> float:
    """Cohen's κ = (p_o − p_e)/(1 − p_e) of two raters' labels (sklearn ``cohen_kappa_score``).

    Undefined when p_e = 1 (both raters give one and the same label to every item) or when the
    input is empty: NaN with a warning (the reference code returned 1.0 there).
    """
    x, y = as_1d("a", a), as_1d("b", b)
    n = same_length(a=x, b=y)
    if n == 0:
        return undefined("Cohen's kappa undefined: no items")
    labels = np.union1d(x, y)
    if labels.size == 1:
        return undefined("Cohen's kappa undefined: both raters use a single, identical label (p_e = 1)")
    return float(cohen_kappa_score(x, y))


def fleiss_kappa(
    table_or_ratings: ArrayLike, kind: Literal["table", "ratings"] = "table"
) -> float:
    """Fleiss' κ for several raters (statsmodels ``inter_rater.fleiss_kappa``, method 'fleiss').

    ``kind="table"``: an (items × categories) count table, every row summing to the number of raters.
    ``kind="ratings"``: an (items × raters) array of category labels, aggregated with
    ``inter_rater.aggregate_raters``. Undefined when p_e = 1 (one category used throughout): NaN.
    """
    arr = np.asarray(table_or_ratings)
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise SiftError(f"table_or_ratings must be a non-empty 2-D array, got shape {arr.shape}")
    if kind == "ratings":
        table, _ = inter_rater.aggregate_raters(arr)
    elif kind == "table":
        table = arr.astype(float)
        sums = table.sum(axis=1)
        if np.any(table < 0) or not np.allclose(sums, sums[0]):
            raise SiftError(
                "table_or_ratings (kind='table') must hold non-negative counts with equal row sums; "
                f"row sums range {sums.min()}..{sums.max()} (pass kind='ratings' for label arrays)"
            )
    else:
        raise SiftError(f"kind must be 'table' or 'ratings', got {kind!r}")
    table = np.asarray(table, dtype=float)
    if table.sum(axis=1)[0] < 2:
        return undefined("Fleiss' kappa undefined: fewer than 2 raters per item")
    p_cat = table.sum(axis=0) / table.sum()
    if np.isclose(np.sum(p_cat**2), 1.0):
        return undefined("Fleiss' kappa undefined: a single category is used throughout (p_e = 1)")
    return float(inter_rater.fleiss_kappa(table, method="fleiss"))
