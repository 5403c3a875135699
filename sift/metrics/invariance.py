"""Meta-faithfulness quantities: IVR, AS, MFS (paper §4.1) and the seed-repeat decomposition (App. E)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from sift.errors import SiftError
from sift.metrics.checks import as_binary, as_mask, check_unit, same_length, undefined

# ------------------------------------------------------------------------------------------------ kernels
# The one place the IVR, AS and MFS formulas are written. ``*_update`` turns per-pair arrays into counts
# (sums, so they add up across batches and DDP ranks), ``*_compute`` turns counts into the metric, as
# torchmetrics' ``_update``/``_compute`` pairs do. No input checks and no warnings: NaN marks "undefined".


def ivr_update(verdict_src: np.ndarray, verdict_dst: np.ndarray, axis: np.ndarray | None = None,
               n_axes: int = 1, keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per preserving axis: number of pairs and of invariance violations φ̂(c') ≠ φ̂(c) (paper eq. 6).

    ``axis``: axis code in [0, n_axes) per pair (None: all in axis 0); ``keep``: pairs to count (None: all).
    """
    ax = np.zeros(np.shape(verdict_src)[0], dtype=np.int64) if axis is None else np.asarray(axis, np.int64)
    flips = np.asarray(verdict_src) != np.asarray(verdict_dst)
    if keep is not None:
        ax, flips = ax[keep], flips[keep]
    n = np.bincount(ax, minlength=n_axes).astype(float)
    violations = np.bincount(ax, weights=flips.astype(float), minlength=n_axes)
    return n, violations


def ivr_compute(n: np.ndarray, violations: np.ndarray) -> tuple[np.ndarray, float]:
    """Per-axis IVR (NaN for an axis without pairs) and the unweighted (macro) mean over axes with pairs."""
    with np.errstate(invalid="ignore", divide="ignore"):
        per = np.where(n > 0, violations / np.maximum(n, 1), math.nan)
    return per, float(per[n > 0].mean()) if np.any(n > 0) else math.nan


def ivr_pooled(n: np.ndarray, violations: np.ndarray) -> float:
    """Pooled IVR: all violations over all preserving pairs (weights axes by their pair counts)."""
    return float(violations.sum() / n.sum()) if n.sum() > 0 else math.nan


def as_update(verdict_before: np.ndarray, verdict_after: np.ndarray, label_before: np.ndarray,
              label_after: np.ndarray, keep: np.ndarray | None = None) -> tuple[float, float]:
    """Number of verified altering pairs (label_after ≠ label_before) among ``keep`` and of those whose verdict
    moves with the label: verdict_after − verdict_before = label_after − label_before (paper eq. 7)."""
    vb, va = np.asarray(verdict_before, np.int64), np.asarray(verdict_after, np.int64)
    lb, la = np.asarray(label_before, np.int64), np.asarray(label_after, np.int64)
    altering = la != lb
    if keep is not None:
        altering = altering & keep
    return float(altering.sum()), float(((va - vb) == (la - lb))[altering].sum())


def as_compute(n: float, moved: float) -> float:
    """AS = moved / n; NaN without altering pairs."""
    return float(moved / n) if n > 0 else math.nan


def mfs_compute(ivr: float, as_: float, coverage: float = 1.0) -> float:
    """MFS = κ·2(1−IVR)·AS / ((1−IVR) + AS) (eq. 8 / eq. 86); NaN if any input is NaN; 0 when (1−IVR) + AS = 0
    (the harmonic mean's limit)."""
    if any(math.isnan(v) for v in (ivr, as_, coverage)):
        return math.nan
    inv = 1.0 - ivr
    return 0.0 if inv + as_ == 0 else coverage * 2.0 * inv * as_ / (inv + as_)


def certified_pairs(rho: np.ndarray, src: np.ndarray, dst: np.ndarray, threshold: float) -> np.ndarray:
    """Pairs whose two traces are both certified (ρ ≥ t): the pairs a certified IVR/AS counts (Def. 4.4)."""
    return (rho[src] >= threshold) & (rho[dst] >= threshold)


# ------------------------------------------------------------------------------------- checked functions


def invariance_violation_rate(
    verdicts_a: ArrayLike, verdicts_b: ArrayLike, mask: ArrayLike | None = None
) -> float:
    """IVR = Pr[φ̂(c') ≠ φ̂(c)] over verified preserving pairs (paper eq. 6, Def. 4.3 M1).

    ``verdicts_a[i]``, ``verdicts_b[i]`` are the binary verdicts on the two traces of pair i.
    ``mask`` (optional, bool per pair) keeps only pairs with both traces certified (Def. 4.4,
    docs/design.md §7). No pairs left: NaN with an ``UndefinedMetricWarning``.
    """
    a, b = as_binary("verdicts_a", verdicts_a), as_binary("verdicts_b", verdicts_b)
    n = same_length(verdicts_a=a, verdicts_b=b)
    keep = as_mask("mask", mask, n)
    if not keep.any():
        return undefined("IVR undefined: no (certified) preserving pairs")
    return float(ivr_compute(*ivr_update(a, b, keep=keep))[0][0])


def ivr_per_axis(
    verdicts_a: ArrayLike,
    verdicts_b: ArrayLike,
    axes: ArrayLike,
    mask: ArrayLike | None = None,
) -> dict[str, float]:
    """IVR (eq. 6) per preserving shift axis, plus ``'mean'``: the unweighted (macro) mean over axes.

    Axes whose pairs are all masked out are NaN and left out of the mean (with a warning).
    """
    a, b = as_binary("verdicts_a", verdicts_a), as_binary("verdicts_b", verdicts_b)
    ax = np.asarray(axes)
    if ax.ndim != 1:
        raise SiftError(f"axes must be 1-D, got shape {ax.shape}")
    n = same_length(verdicts_a=a, verdicts_b=b, axes=ax)
    keep = as_mask("mask", mask, n)
    names = [str(v) for v in ax]
    if "mean" in names:
        raise SiftError("axes may not contain the name 'mean' (reserved for the macro mean)")
    order, codes = np.unique(np.asarray(names, dtype=object), return_inverse=True)
    per, mean = ivr_compute(*ivr_update(a, b, np.asarray(codes).reshape(-1), len(order), keep))
    out: dict[str, float] = {}
    for name, v in zip(order.tolist(), per.tolist()):
        out[name] = v if not math.isnan(v) else undefined(f"IVR undefined for axis {name!r}: no (certified) pairs")
    out["mean"] = mean if not math.isnan(mean) else undefined("IVR macro mean undefined: no axis has pairs")
    return out


def alteration_sensitivity(
    verdicts_before: ArrayLike,
    verdicts_after: ArrayLike,
    labels_before: ArrayLike,
    labels_after: ArrayLike,
    mask: ArrayLike | None = None,
) -> float:
    """AS = Pr[D moves correctly] over verified altering pairs (paper eq. 7, Def. 4.3 M2).

    Pair i moves correctly iff ``verdict_after − verdict_before == label_after − label_before``
    with ``label_after ≠ label_before``, i.e. the verdict flips in the direction of the verified
    label flip (0→1 or 1→0); a verdict that already sat at the new label, or flips the wrong way,
    is a failure. Pairs whose labels do not change are not verified altering pairs (Def. 4.2): they
    are excluded from the denominator with a warning, unlike the reference code, which counts them
    as failures. No pairs left: NaN with a warning.
    """
    vb, va = as_binary("verdicts_before", verdicts_before), as_binary("verdicts_after", verdicts_after)
    lb, la = as_binary("labels_before", labels_before), as_binary("labels_after", labels_after)
    n = same_length(verdicts_before=vb, verdicts_after=va, labels_before=lb, labels_after=la)
    keep = as_mask("mask", mask, n)
    n_static = int(np.sum(keep & (la == lb)))
    if n_static:
        undefined(f"AS: {n_static} pair(s) with labels_after == labels_before excluded (not altering)")
    n_alt, moved = as_update(vb, va, lb, la, keep)
    if n_alt == 0:
        return undefined("AS undefined: no (certified) verified altering pairs")
    return as_compute(n_alt, moved)


def meta_faithfulness_score(ivr: float, as_: float, coverage: float = 1.0) -> float:
    """MFS = κ·2(1−IVR)·AS / ((1−IVR) + AS), κ = certified coverage (eq. 8 / eq. 86, docs/design.md §7).

    IVR and AS should be computed on the certified subset. Any NaN input gives NaN. When
    1−IVR = AS = 0 the harmonic mean is taken as its limit 0 (documented convention, not an error).
    Inputs outside [0, 1] raise SiftError. Checked inputs, then :func:`mfs_compute`.
    """
    return mfs_compute(check_unit("ivr", ivr), check_unit("as_", as_), check_unit("coverage", coverage))


@dataclass(frozen=True)
class SeedRepeatDecomposition:
    """Paper App. E.1, eqs. 45–48: raw = floor + shift_attributable − overlap.

    ``overlap_low``/``overlap_high``: 95 % cluster-bootstrap CI of the overlap (NaN unless ``groups``
    was given). ``reason`` is non-empty when the decomposition is undefined.
    """

    floor: float
    shift_attributable: float
    overlap: float
    raw: float
    n: int
    overlap_low: float = math.nan
    overlap_high: float = math.nan
    reason: str = ""

    @property
    def stochastic_fraction(self) -> float:
        """floor / raw: share of raw instability due to seed variation (paper §1: "over 80 %")."""
        return self.floor / self.raw if self.raw > 0 else math.nan


def seed_repeat_decomposition(
    seed1_orig: ArrayLike,
    seed2_orig: ArrayLike,
    seed1_shifted: ArrayLike,
    groups: ArrayLike | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
) -> SeedRepeatDecomposition:
    """Seed-repeat floor vs shift-attributable instability (paper App. E.1, eqs. 45–48; docs/design.md §7).

    S = 1[φ̂_seed1(c) ≠ φ̂_seed2(c)] (eq. 45), T = 1[φ̂_seed1(c) ≠ φ̂_seed1(T(c))] (eq. 46);
    floor = P(S), shift_attributable = P(T), overlap = P(S∧T), raw = P(S∨T) (eq. 47).
    With ``groups`` (base-item id per trace), the overlap gets a cluster-bootstrap 95 % CI.
    """
    s1 = as_binary("seed1_orig", seed1_orig)
    s2 = as_binary("seed2_orig", seed2_orig)
    sh = as_binary("seed1_shifted", seed1_shifted)
    n = same_length(seed1_orig=s1, seed2_orig=s2, seed1_shifted=sh)
    if n == 0:
        reason = "seed-repeat decomposition undefined: no traces"
        undefined(reason)
        nan = math.nan
        return SeedRepeatDecomposition(nan, nan, nan, nan, 0, reason=reason)
    S, T = s1 != s2, s1 != sh
    both = S & T
    low = high = math.nan
    if groups is not None:
        from sift.metrics.bootstrap import cluster_bootstrap

        if np.shape(groups) != (n,):
            raise SiftError(f"length mismatch: groups has shape {np.shape(groups)}, expected ({n},)")

        ci = cluster_bootstrap(lambda idx: float(np.mean(both[idx])), groups, n_resamples, seed)
        low, high = ci.low, ci.high
    return SeedRepeatDecomposition(
        floor=float(S.mean()),
        shift_attributable=float(T.mean()),
        overlap=float(both.mean()),
        raw=float((S | T).mean()),
        n=n,
        overlap_low=low,
        overlap_high=high,
    )
