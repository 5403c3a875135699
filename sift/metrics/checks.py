"""Input validation shared by the metric functions, and the warning an undefined metric raises."""

from __future__ import annotations

import math
import warnings

import numpy as np
from numpy.typing import ArrayLike

from sift.errors import SiftError


class UndefinedMetricWarning(UserWarning):
    """A metric is undefined for the given input (one class, no pairs, no feasible threshold, ...)."""


def undefined(reason: str, stacklevel: int = 3) -> float:
    """Warn with ``reason`` and return NaN: the single way an undefined metric is reported."""
    warnings.warn(reason, UndefinedMetricWarning, stacklevel=stacklevel)
    return math.nan


def as_1d(name: str, x: ArrayLike, dtype: type = float) -> np.ndarray:
    """``x`` as a 1-D array; SiftError naming ``name`` if it is not 1-D."""
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise SiftError(f"{name} must be 1-D, got shape {arr.shape}")
    try:
        return arr.astype(dtype, copy=False)
    except (TypeError, ValueError) as exc:
        raise SiftError(f"{name} must be numeric, got dtype {arr.dtype}") from exc


def as_finite(name: str, x: ArrayLike) -> np.ndarray:
    """1-D float array with no NaN/inf."""
    arr = as_1d(name, x)
    if not np.all(np.isfinite(arr)):
        raise SiftError(f"{name} contains {int(np.sum(~np.isfinite(arr)))} non-finite value(s)")
    return arr


def as_binary(name: str, x: ArrayLike) -> np.ndarray:
    """1-D int array with values in {0, 1} (bools accepted); SiftError otherwise."""
    arr = as_1d(name, x)
    bad = ~np.isin(arr, (0, 1))
    if bad.any():
        shown = np.unique(arr[bad])[:5].tolist()
        raise SiftError(
            f"{name} must be binary 0/1 (filter abstentions first, or pass a mask); found {shown}"
        )
    return arr.astype(np.int64)


def same_length(**arrays: np.ndarray) -> int:
    """Common length of the named 1-D arrays; SiftError naming every argument and shape if they differ."""
    lengths = {name: np.shape(a)[0] for name, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        desc = ", ".join(f"{name} has shape {np.shape(a)}" for name, a in arrays.items())
        raise SiftError(f"length mismatch: {desc}")
    return next(iter(lengths.values())) if lengths else 0


def as_mask(name: str, mask: ArrayLike | None, n: int) -> np.ndarray:
    """Boolean selection mask of length ``n`` (all True when ``mask`` is None)."""
    if mask is None:
        return np.ones(n, dtype=bool)
    m = as_binary(name, mask).astype(bool)
    if m.shape[0] != n:
        raise SiftError(f"length mismatch: {name} has shape {m.shape}, expected ({n},)")
    return m


def check_unit(name: str, value: float, *, open_interval: bool = False) -> float:
    """A float in [0, 1] (or (0, 1) if ``open_interval``); NaN passes through."""
    v = float(value)
    if math.isnan(v):
        return v
    ok = 0.0 < v < 1.0 if open_interval else 0.0 <= v <= 1.0
    if not ok:
        interval = "(0, 1)" if open_interval else "[0, 1]"
        raise SiftError(f"{name} must lie in {interval}, got {v}")
    return v
