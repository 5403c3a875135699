"""Certified IVR, AS, coverage and MFS at an operating point: the one kernel behind every table, appendix analysis
and training callback (docs/design.md §7).

Rules, each stated once here and tested in ``tests/metrics/test_operating.py``:

* **Certification is a threshold on the gate.** A trace is certified iff ρ ≥ t; a pair counts iff both its
  traces are certified (Def. 4.4). The operating point sets t:

  - ``full``: t = −∞ (every trace certified, κ = 1);
  - ``coverage`` κ: t = the ⌈κn⌉-th largest ρ of the population (:func:`coverage_threshold`);
  - ``gate``: a fixed t;
  - ``sgr``: the SGR threshold t* of :func:`sift.metrics.sgr` (calibrated wherever the caller chose).

* **Tie rule.** Traces tied with t at the coverage point are all certified, so the realised coverage is
  ≥ κ when ρ ties; certification never depends on the order of the rows.
* **κ in MFS** is the realised share of the population's traces with ρ ≥ t, not the nominal κ.
* **Infeasible rule.** An SGR point whose certificate is infeasible certifies nothing: κ = 0, certified IVR and
  AS undefined (NaN), MFS = κ·HM = 0 — counted as 0 in means over seeds, not skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from sift.errors import SiftError
from sift.metrics.invariance import as_compute, as_update, certified_pairs, ivr_compute, ivr_update, mfs_compute

Kind = Literal["full", "coverage", "gate", "sgr"]


def coverage_threshold(rho: ArrayLike, coverage: float) -> float:
    """Gate threshold t of coverage κ: the ⌈κn⌉-th largest ρ, so P(ρ ≥ t) ≥ κ (larger when ρ ties at t).

    κ = 1 gives min ρ (every trace certified); an empty ρ gives +inf (nothing certified).
    """
    r = np.asarray(rho, dtype=float)
    if not 0.0 < coverage <= 1.0:
        raise SiftError(f"coverage must lie in (0, 1], got {coverage}")
    if r.size == 0:
        return math.inf
    k = max(1, math.ceil(coverage * r.size - 1e-9))
    return float(np.partition(r, r.size - k)[r.size - k])


@dataclass(frozen=True)
class OperatingPoint:
    """Where a detector commits: ``kind`` and its ``value`` (κ for ``coverage``, t for ``gate`` and ``sgr``);
    ``feasible`` is False for an SGR point whose certificate was infeasible (it certifies nothing)."""

    kind: Kind
    value: float = math.nan
    feasible: bool = True

    @classmethod
    def full(cls) -> OperatingPoint:
        return cls("full")

    @classmethod
    def at_coverage(cls, coverage: float) -> OperatingPoint:
        if not 0.0 < coverage <= 1.0:
            raise SiftError(f"coverage must lie in (0, 1], got {coverage}")
        return cls("coverage", float(coverage))

    @classmethod
    def at_gate(cls, threshold: float) -> OperatingPoint:
        return cls("gate", float(threshold))

    @classmethod
    def sgr(cls, threshold: float, feasible: bool) -> OperatingPoint:
        """The SGR point of a certificate (``SGRResult.threshold``, ``SGRResult.feasible``)."""
        return cls("sgr", float(threshold) if feasible else math.inf, bool(feasible))

    def threshold(self, population_rho: np.ndarray) -> float:
        """The gate threshold t on ρ (±inf where nothing / everything is certified)."""
        if self.kind == "full":
            return -math.inf
        if self.kind == "coverage":
            return coverage_threshold(population_rho, self.value)
        if self.kind in ("gate", "sgr"):
            return self.value if self.feasible else math.inf
        raise SiftError(f"operating point kind must be full, coverage, gate or sgr, got {self.kind!r}")


@dataclass(frozen=True, eq=False)
class PairArrays:
    """Verified pairs as rows into per-trace arrays: ``src``/``dst`` trace rows; ``axis`` the preserving axis code
    in [0, n_axes) (preserving pairs); ``label_src``/``label_dst`` the verified φ* of both traces (altering pairs:
    AS counts those whose labels differ)."""

    src: np.ndarray
    dst: np.ndarray
    axis: np.ndarray | None = None
    label_src: np.ndarray | None = None
    label_dst: np.ndarray | None = None

    def take(self, rows: np.ndarray) -> PairArrays:
        """The pairs at ``rows`` (indices or a boolean mask)."""
        def pick(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[rows]

        return PairArrays(self.src[rows], self.dst[rows], pick(self.axis), pick(self.label_src),
                          pick(self.label_dst))


@dataclass(frozen=True, eq=False)
class OperatingMetrics:
    """Certified numbers at one operating point: per-axis IVR and their macro mean, AS, κ, MFS and t."""

    ivr_axes: np.ndarray
    ivr: float
    as_: float
    coverage: float
    mfs: float
    threshold: float

    def as_tuple(self) -> tuple[float, float, float, float]:
        """(IVR, AS, κ, MFS)."""
        return self.ivr, self.as_, self.coverage, self.mfs


def operating_metrics(point: OperatingPoint, population_rho: np.ndarray, verdict: np.ndarray, rho: np.ndarray,
                      preserving: PairArrays, altering: PairArrays, n_axes: int = 1) -> OperatingMetrics:
    """IVR (per axis and macro mean), AS, κ and MFS = κ·HM(1 − IVR, AS) of the pairs whose both traces are
    certified at ``point`` (module rules).

    ``population_rho``: ρ of the traces whose share is κ (and on which a coverage point sets t); ``verdict``/``rho``:
    per-trace arrays the pairs' rows index.
    """
    t = point.threshold(population_rho)
    pop = np.asarray(population_rho, dtype=float)
    if point.kind == "full":
        kappa = 1.0
    elif not point.feasible:
        kappa = 0.0
    else:
        kappa = float(np.mean(pop >= t)) if pop.size else math.nan
    keep_p = certified_pairs(rho, preserving.src, preserving.dst, t)
    per, ivr = ivr_compute(*ivr_update(verdict[preserving.src], verdict[preserving.dst], preserving.axis, n_axes,
                                       keep_p))
    keep_a = certified_pairs(rho, altering.src, altering.dst, t)
    as_ = as_compute(*as_update(verdict[altering.src], verdict[altering.dst], altering.label_src,
                                altering.label_dst, keep_a))
    mfs = mfs_compute(ivr, as_, kappa) if point.feasible else 0.0
    return OperatingMetrics(per, ivr, as_, kappa, mfs, t)
