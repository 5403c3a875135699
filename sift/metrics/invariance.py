"""Meta-faithfulness quantities: IVR, AS, MFS (paper §4.1) and the seed-repeat decomposition (App. E)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from sift.errors import SiftError
from sift.metrics._checks import as_binary, as_mask, check_unit, same_length, undefined


def invariance_violation_rate(
    verdicts_a: ArrayLike, verdicts_b: ArrayLike, mask: ArrayLike | None = None
) -> float:
    """IVR = Pr[φ̂(c') ≠ φ̂(c)] over verified preserving pairs (paper eq. 6, Def. 4.3 M1).

    ``verdicts_a[i]``, ``verdicts_b[i]`` are the binary verdicts on the two traces of pair i.
    ``mask`` (optional, bool per pair) keeps only pairs with both traces certified (Def. 4.4,
    DESIGN §7). No pairs left: NaN with an ``UndefinedMetricWarning``.
    """
    a, b = as_binary("verdicts_a", verdicts_a), as_binary("verdicts_b", verdicts_b)
    n = same_length(verdicts_a=a, verdicts_b=b)
    keep = as_mask("mask", mask, n)
    if not keep.any():
        return undefined("IVR undefined: no (certified) preserving pairs")
    return float(np.mean(a[keep] != b[keep]))


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
    names_arr = np.asarray(names, dtype=object)
    out: dict[str, float] = {}
    for name in sorted(set(names)):
        sel = (names_arr == name) & keep
        out[name] = (
            float(np.mean(a[sel] != b[sel]))
            if sel.any()
            else undefined(f"IVR undefined for axis {name!r}: no (certified) pairs")
        )
    vals = [v for v in out.values() if not math.isnan(v)]
    out["mean"] = float(np.mean(vals)) if vals else undefined("IVR macro mean undefined: no axis has pairs")
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
    altering = la != lb
    n_static = int(np.sum(keep & ~altering))
    if n_static:
        undefined(f"AS: {n_static} pair(s) with labels_after == labels_before excluded (not altering)")
    keep &= altering
    if not keep.any():
        return undefined("AS undefined: no (certified) verified altering pairs")
    moves = (va - vb) == (la - lb)
    return float(np.mean(moves[keep]))


def meta_faithfulness_score(ivr: float, as_: float, coverage: float = 1.0) -> float:
    """MFS = κ·2(1−IVR)·AS / ((1−IVR) + AS), κ = certified coverage (eq. 8 / eq. 86, DESIGN §7).

    IVR and AS should be computed on the certified subset. Any NaN input gives NaN. When
    1−IVR = AS = 0 the harmonic mean is taken as its limit 0 (documented convention, not an error).
    Inputs outside [0, 1] raise SiftError.
    """
    ivr, as_, kappa = check_unit("ivr", ivr), check_unit("as_", as_), check_unit("coverage", coverage)
    if any(math.isnan(v) for v in (ivr, as_, kappa)):
        return math.nan
    inv = 1.0 - ivr
    if inv + as_ == 0.0:
        return 0.0
    return kappa * 2.0 * inv * as_ / (inv + as_)


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
    """Seed-repeat floor vs shift-attributable instability (paper App. E.1, eqs. 45–48; DESIGN §7).

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
