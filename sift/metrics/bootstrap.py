"""Cluster (base-item) percentile bootstrap (paper §7.1: 1,000 resamples stratified by base item)."""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
from numpy.typing import ArrayLike

from sift.errors import SiftError
from sift.metrics._checks import UndefinedMetricWarning, undefined


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


def cluster_resamples(groups: ArrayLike, n_resamples: int, seed: int = 0,
                      confidence: float = 0.95) -> Iterator[np.ndarray]:
    """Row indices of ``n_resamples`` cluster-bootstrap replicates (the one resampling scheme of sift).

    Each replicate draws as many groups as there are, with replacement, and yields the concatenated row
    indices of every drawn group (a group drawn twice appears twice, rows of a group stay contiguous).
    """
    g = np.asarray(groups)
    if g.ndim != 1 or g.size == 0:
        raise SiftError(f"groups must be a non-empty 1-D array, got shape {g.shape}")
    if n_resamples < 1:
        raise SiftError(f"n_resamples must be >= 1, got {n_resamples}")
    if not 0.0 < confidence < 1.0:
        raise SiftError(f"confidence must lie in (0, 1), got {confidence}")
    _, inverse = np.unique(g, return_inverse=True)
    order = np.argsort(inverse, kind="mergesort")  # rows grouped, original order inside a group
    sizes = np.bincount(inverse)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    n_groups = sizes.size
    rng = np.random.default_rng(seed)
    for _ in range(n_resamples):
        drawn = rng.integers(0, n_groups, size=n_groups)
        lens = sizes[drawn]
        # position of each output row in `order`: start of its group + offset inside the group
        offsets = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)
        yield order[np.repeat(starts[drawn], lens) + offsets]


def cluster_bootstrap(
    statistic: Callable[[np.ndarray], float],
    groups: ArrayLike,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    keep_replicates: bool = False,
) -> BootstrapResult:
    """Percentile bootstrap CI, resampling whole base items (DESIGN §7; paper §7.1).

    ``groups[i]`` is the base-item id of row i of the dataset. Each replicate draws as many groups as
    there are, with replacement, and passes ``statistic`` the concatenated row indices of every drawn
    group (a group drawn twice appears twice, rows of a group stay contiguous). ``statistic(idx)``
    must return a float computed on the rows ``idx`` of the caller's own arrays, e.g.
    ``lambda idx: auroc(scores[idx], labels[idx])``. The estimate is ``statistic(arange(n))``.
    NaN replicates (e.g. a single-class resample) are dropped and counted in ``n_nan``.
    For the plain i.i.d. bootstrap pass ``groups=np.arange(n)``. ``keep_replicates`` returns the replicate
    values in ``replicates`` (same generator draws, so the CI does not change).
    """
    resamples = cluster_resamples(groups, n_resamples, seed, confidence)  # validates the arguments
    first = next(resamples)
    estimate = float(statistic(np.arange(np.asarray(groups).size)))
    reps = np.empty(n_resamples)
    with warnings.catch_warnings():  # NaN replicates are counted in n_nan instead of warned
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        for r, idx in enumerate(itertools.chain([first], resamples)):
            reps[r] = statistic(idx)
    valid = reps[~np.isnan(reps)]
    n_nan = n_resamples - valid.size
    if valid.size == 0:
        undefined(f"bootstrap CI undefined: all {n_resamples} replicates are NaN")
        return BootstrapResult(estimate, math.nan, math.nan, n_resamples, n_nan, reps if keep_replicates else None)
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(valid, [tail, 100.0 - tail])
    return BootstrapResult(estimate, float(low), float(high), n_resamples, n_nan, reps if keep_replicates else None)
