"""The cluster (base-item) percentile bootstrap of sift: one engine, every front-end (paper §7.1: 1,000
resamples stratified by base item).

* :func:`draw_clusters` — the random draws: per replicate, the codes of as many clusters as there are (per
  stratum), with replacement. Every bootstrap in sift consumes its generator through this function.
* :class:`ClusterRows` — rows grouped by cluster: the rows of the drawn clusters (with repeats).
* :func:`bootstrap_drawn` — the engine: a vector statistic of the drawn clusters, its replicates and the
  percentile CI (:func:`percentile_ci`).
* :func:`cluster_bootstrap` — the scalar front-end on row indices of the caller's own arrays.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from sift.errors import SiftError
from sift.metrics.checks import UndefinedMetricWarning, undefined


@dataclass(frozen=True)
class BootstrapResult:
    """Point estimate on the full data and the percentile CI over the non-NaN replicates."""

    estimate: float
    low: float
    high: float
    n_resamples: int
    n_nan: int
    #: the replicate values (NaN included), only with ``keep_replicates=True`` (e.g. for bootstrap p-values)
    replicates: np.ndarray | None = field(default=None, compare=False, repr=False)


def draw_clusters(n_clusters: int, n_resamples: int, seed: int = 0,
                  strata: ArrayLike | None = None) -> Iterator[np.ndarray]:
    """Cluster codes of ``n_resamples`` replicates: each stratum's clusters drawn with replacement, as many as it
    holds (one stratum by default), from ``numpy.random.default_rng(seed)``."""
    if strata is None:
        pools = [np.arange(n_clusters)]
    else:
        s = np.asarray(strata)
        if s.shape != (n_clusters,):
            raise SiftError(f"strata must have one entry per item ({n_clusters}), got shape {s.shape}")
        pools = [np.flatnonzero(s == v) for v in np.unique(s)]
    rng = np.random.default_rng(seed)
    for _ in range(n_resamples):
        yield np.concatenate([g[rng.integers(0, g.size, size=g.size)] for g in pools])


class ClusterRows:
    """Rows grouped by cluster code (CSR): ``rows(drawn)`` = the concatenated rows of the drawn clusters, a
    cluster drawn twice appearing twice, rows of a cluster contiguous and in their original order."""

    def __init__(self, codes: ArrayLike, n_clusters: int | None = None):
        c = np.asarray(codes, dtype=np.int64)
        self.n = c.size
        self.order = np.argsort(c, kind="mergesort")
        self.sizes = np.bincount(c, minlength=0 if n_clusters is None else n_clusters)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)

    @classmethod
    def of_labels(cls, groups: ArrayLike) -> ClusterRows:
        """From one cluster label per row (any hashable type; clusters numbered in sorted order)."""
        _, inverse = np.unique(np.asarray(groups), return_inverse=True)
        return cls(np.asarray(inverse).reshape(-1))

    @property
    def n_clusters(self) -> int:
        return int(self.sizes.size)

    def rows(self, drawn: np.ndarray | None) -> np.ndarray:
        """Rows of the drawn cluster codes (all rows for ``None``)."""
        if drawn is None:
            return np.arange(self.n)
        lens = self.sizes[drawn]
        total = int(lens.sum())
        if total == 0:
            return np.zeros(0, dtype=np.int64)
        offsets = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens)
        return self.order[np.repeat(self.starts[drawn], lens) + offsets]


def percentile_ci(replicates: np.ndarray, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of every column of ``replicates`` [R, k] over its non-NaN values (NaN if none)."""
    reps = np.asarray(replicates, dtype=float).reshape(len(replicates), -1)
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.full(reps.shape[1], math.nan), np.full(reps.shape[1], math.nan)
    for j in range(reps.shape[1]):
        v = reps[:, j][~np.isnan(reps[:, j])]
        if v.size:
            low[j], high[j] = np.percentile(v, [tail, 100.0 - tail])
    return low, high


def bootstrap_p_value(replicates: ArrayLike, null: float = 0.0, floor: bool = False) -> float:
    """Two-sided percentile-bootstrap p-value of H0: θ = ``null``: 2·min(P*(θ* ≤ null), P*(θ* ≥ null)) over the
    non-NaN replicates, capped at 1; NaN without replicates. ``floor``: at least 1/(replicates + 1) (the appendix
    convention, which never reports p = 0 from a finite bootstrap)."""
    r = np.asarray(replicates, dtype=float)
    r = r[~np.isnan(r)]
    if r.size == 0:
        return math.nan
    p = 2.0 * min(np.mean(r <= null), np.mean(r >= null))
    return float(min(1.0, max(p, 1.0 / (r.size + 1)))) if floor else float(min(1.0, p))


def _check(n_resamples: int, confidence: float, minimum: int = 1) -> None:
    if n_resamples < minimum:
        raise SiftError(f"n_resamples must be >= {minimum}, got {n_resamples}")
    if not 0.0 < confidence < 1.0:
        raise SiftError(f"confidence must lie in (0, 1), got {confidence}")


def bootstrap_drawn(statistic: Callable[[np.ndarray | None], ArrayLike], n_clusters: int, n_resamples: int,
                    seed: int = 0, confidence: float = 0.95, strata: ArrayLike | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The engine: ``(estimate, replicates [R, k], low, high)`` of a vector statistic of drawn clusters.

    ``statistic(None)`` is the estimate on all data, ``statistic(drawn)`` its value on the drawn cluster codes
    of one replicate (:func:`draw_clusters`). With ``n_resamples = 0`` or no cluster the CI is NaN. NaN
    replicates are ignored per component. UndefinedMetricWarning and RuntimeWarning are silenced in the loop
    (not for the estimate).
    """
    _check(n_resamples, confidence, minimum=0)
    est = np.atleast_1d(np.asarray(statistic(None), dtype=float))
    if n_resamples == 0 or n_clusters == 0:
        nan = np.full(est.shape, math.nan)
        return est, np.zeros((0, est.size)), nan, nan.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        reps = np.full((n_resamples, est.size), math.nan)
        for r, drawn in enumerate(draw_clusters(n_clusters, n_resamples, seed, strata)):
            reps[r] = np.asarray(statistic(drawn), dtype=float)
    low, high = percentile_ci(reps, confidence)
    return est, reps, low, high


def cluster_resamples(groups: ArrayLike, n_resamples: int, seed: int = 0,
                      confidence: float = 0.95) -> Iterator[np.ndarray]:
    """Row indices of ``n_resamples`` cluster-bootstrap replicates over one cluster label per row."""
    g = np.asarray(groups)
    if g.ndim != 1 or g.size == 0:
        raise SiftError(f"groups must be a non-empty 1-D array, got shape {g.shape}")
    _check(n_resamples, confidence)
    index = ClusterRows.of_labels(g)
    for drawn in draw_clusters(index.n_clusters, n_resamples, seed):
        yield index.rows(drawn)


def cluster_bootstrap(
    statistic: Callable[[np.ndarray], float],
    groups: ArrayLike,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    keep_replicates: bool = False,
) -> BootstrapResult:
    """Percentile bootstrap CI, resampling whole base items (docs/design.md §7; paper §7.1).

    ``groups[i]`` is the base-item id of row i of the dataset. Each replicate draws as many groups as
    there are, with replacement, and passes ``statistic`` the concatenated row indices of every drawn
    group (a group drawn twice appears twice, rows of a group stay contiguous). ``statistic(idx)``
    must return a float computed on the rows ``idx`` of the caller's own arrays, e.g.
    ``lambda idx: auroc(scores[idx], labels[idx])``. The estimate is ``statistic(arange(n))``.
    NaN replicates (e.g. a single-class resample) are dropped and counted in ``n_nan``.
    For the plain i.i.d. bootstrap pass ``groups=np.arange(n)``. ``keep_replicates`` returns the replicate
    values in ``replicates`` (same generator draws, so the CI does not change).
    """
    g = np.asarray(groups)
    if g.ndim != 1 or g.size == 0:
        raise SiftError(f"groups must be a non-empty 1-D array, got shape {g.shape}")
    _check(n_resamples, confidence)
    index = ClusterRows.of_labels(g)
    est, reps, low, high = bootstrap_drawn(lambda drawn: statistic(index.rows(drawn)), index.n_clusters,
                                           n_resamples, seed, confidence)
    flat = reps[:, 0]
    n_nan = int(np.isnan(flat).sum())
    if n_nan == n_resamples:
        undefined(f"bootstrap CI undefined: all {n_resamples} replicates are NaN")
    return BootstrapResult(float(est[0]), float(low[0]), float(high[0]), n_resamples, n_nan,
                           flat if keep_replicates else None)
