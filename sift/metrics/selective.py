"""Selective guaranteed risk (SGR): certified abstention (paper Thm. 4.7, §6.1.3, App. K.5).

The selective risk is per trace; by default it is certified with a bound over base items
(:mod:`sift.metrics.betting`), because the traces of one item are not independent (docs/design.md §7).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from sift.errors import SiftError
from sift.metrics.betting import betting_bounds, item_codes, item_counts
from sift.metrics.binomial import clopper_pearson_upper, wald_upper
from sift.metrics.checks import as_binary, as_finite, check_unit, same_length, undefined
from sift.metrics.operating import coverage_threshold

#: Default candidate thresholds, fixed before seeing data: a grid over the range of ρ = max(s, 1−s) in steps of
#: 0.05. Every candidate costs δ/|𝒯| (Bonferroni), so a coarse grid leaves more of δ to each bound: with the item
#: bound, 11 candidates need about a fifth fewer calibration items than the paper's 51 (docs/design.md §7).
DEFAULT_CANDIDATES = np.linspace(0.5, 1.0, 11)


def gate(scores):  # noqa: ANN001, ANN201 -- numpy arrays or torch tensors alike
    """The gate ρ = max(s, 1 − s) of detector probabilities s (docs/design.md §7), elementwise, for a numpy array
    or a torch tensor of any shape (the one place the formula is written; no input checks)."""
    other = 1.0 - scores
    return scores.maximum(other) if hasattr(scores, "maximum") else np.maximum(scores, other)


def confidence_gate(scores: ArrayLike) -> np.ndarray:
    """:func:`gate` of a 1-D array of finite probabilities (SiftError otherwise)."""
    return gate(as_finite("scores", scores))


@dataclass(frozen=True, eq=False)
class RiskCoverageCurve:
    """Per candidate threshold t (ascending): coverage n_t/n, empirical risk e_t/n_t (eq. 32, NaN if
    n_t = 0), the upper bound U(t), and n_t (eq. 33)."""

    thresholds: np.ndarray
    coverage: np.ndarray
    risk: np.ndarray
    bound: np.ndarray
    n_selected: np.ndarray


@dataclass(frozen=True, eq=False)
class SGRResult:
    """Chosen threshold t* and its calibration coverage, empirical selective risk and bound value.

    Infeasible (no candidate certified): ``feasible=False``, ``threshold=inf``, coverage 0, NaN risk
    and bound, and ``reason`` says why. ``bound`` names the bound used; ``n_items`` counts the base items
    of the calibration sample (0 for the trace-level bounds, which do not use them).
    """

    threshold: float
    coverage: float
    selective_risk: float
    bound_value: float
    n_selected: int
    feasible: bool
    reason: str
    curve: RiskCoverageCurve
    bound: str = "betting"
    n_items: int = 0


#: the bounds :func:`sgr` knows: ``betting`` (over base items, the default) and the trace-level ones of the paper
BOUNDS = ("betting", "clopper-pearson", "normal")
#: bounds whose independent unit is the base item (they need the item of every trace)
ITEM_BOUNDS = ("betting",)


def check_bound(bound: str) -> str:
    """``bound`` if :func:`sgr` knows it, else a SiftError listing the choices."""
    if bound not in BOUNDS:
        raise SiftError(f"bound must be one of {', '.join(BOUNDS)}, got {bound!r}")
    return bound


def upper_bounds(errors: np.ndarray, n_sel: np.ndarray, delta_each: float, bound: str) -> np.ndarray:
    """Trace-level one-sided (1 − δ') upper bounds on the selective error rate (:mod:`sift.metrics.binomial`);
    inf where n_t = 0. ``"clopper-pearson"``: exact (App. K.5) for independent traces; ``"normal"``: the Wald
    bound of eq. 34. Neither is valid when traces of one base item are correlated (use :func:`candidate_bounds`
    with ``"betting"``)."""
    out = np.full(np.shape(errors), np.inf)
    has = n_sel > 0
    e, n = errors[has], n_sel[has]
    out[has] = clopper_pearson_upper(e, n, delta_each) if bound == "clopper-pearson" else wald_upper(e, n, delta_each)
    return out


def selection_counts(confidence: np.ndarray, errors: np.ndarray, thresholds: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """n_t (traces with ρ ≥ t) and e_t (errors among them) for every threshold t at once (eq. 33), by sorting ρ:
    O((n + K) log n)."""
    order = np.argsort(confidence, kind="mergesort")
    start = np.searchsorted(confidence[order], thresholds, side="left")  # first index with ρ ≥ t
    n_sel = (confidence.size - start).astype(np.int64)
    cum_err = np.concatenate([[0], np.cumsum(errors[order][::-1])])  # errors among the top j
    return n_sel, cum_err[n_sel].astype(np.int64)


def first_feasible(bounds: np.ndarray, alpha: float) -> int | None:
    """Index of the smallest candidate (candidates ascend) whose bound is ≤ α (eq. 35); None if none is."""
    ok = np.flatnonzero(bounds <= alpha)
    return int(ok[0]) if ok.size else None


@dataclass(frozen=True, eq=False)
class CandidateBounds:
    """Per candidate threshold: traces selected and their errors, the bound U(t) (NaN when not computed) and
    whether t is certified at α; ``n_items`` base items in the sample (0 for trace-level bounds)."""

    n_selected: np.ndarray
    errors: np.ndarray
    bound: np.ndarray
    certified: np.ndarray
    n_items: int


def item_scale(codes: np.ndarray, n_items: int, max_traces: int | None) -> float:
    """M, the most traces one item may hold: ``max_traces`` if given (checked against the sample), else the
    largest item of the sample."""
    largest = int(np.bincount(codes, minlength=n_items).max()) if codes.size else 0
    if max_traces is None:
        return float(max(largest, 1))
    if int(max_traces) < largest:
        raise SiftError(f"max_traces = {max_traces} but an item of the sample has {largest} traces")
    return float(max_traces)


def candidate_bounds(confidence: np.ndarray, correct: np.ndarray, thresholds: np.ndarray, alpha: float,
                     delta_each: float, bound: str = "betting", groups: ArrayLike | None = None,
                     max_traces: int | None = None, values: bool = True) -> CandidateBounds:
    """The one certification kernel (:func:`sgr`, :func:`risk_upper_bound`, the appendix bootstrap loops):
    for every threshold t, the traces with ρ ≥ t, a one-sided (1 − δ') upper bound U(t) on their per-trace
    error rate, and whether U(t) ≤ α.

    ``"betting"`` (default): the bound over base items of :mod:`sift.metrics.betting`; ``groups`` gives the
    base item of every trace (required) and ``max_traces`` the most traces one item may hold (default: the
    largest item of the sample). ``values=False`` skips computing U (only the test at α), for bootstrap loops.
    ``"clopper-pearson"`` / ``"normal"``: the trace-level bounds (``groups`` ignored).
    """
    check_bound(bound)
    rho, ok = np.asarray(confidence, float), np.asarray(correct, int)
    n_sel, e_sel = selection_counts(rho, 1 - ok, thresholds)
    if bound not in ITEM_BOUNDS:
        ub = upper_bounds(e_sel, n_sel, delta_each, bound)
        return CandidateBounds(n_sel, e_sel, ub, ub <= alpha, 0)
    if groups is None:
        raise SiftError(f"the {bound!r} bound needs the base item of every trace (groups=...): it treats items, "
                        f"not traces, as the independent draws; pass groups=numpy.arange(n) only if every trace "
                        f"is independent of the others")
    codes, names = item_codes(groups, rho.size)
    scale = item_scale(codes, names.size, max_traces)
    big_n, big_e = item_counts(rho[None, :] >= thresholds[:, None], 1 - ok, codes, names.size)
    ub, passed = betting_bounds(big_n, big_e, delta_each, scale, alpha, values)
    return CandidateBounds(n_sel, e_sel, ub, passed, int(names.size))


def candidate_grid(candidates: Sequence[float] | ArrayLike | None) -> np.ndarray:
    """The candidate thresholds 𝒯, ascending and unique (default :data:`DEFAULT_CANDIDATES`)."""
    if candidates is None:
        return DEFAULT_CANDIDATES
    ts = np.unique(as_finite("candidates", np.atleast_1d(np.asarray(candidates, dtype=float))))
    if ts.size == 0:
        raise SiftError("candidates is empty")
    return ts


def sgr(
    confidence: ArrayLike,
    correct: ArrayLike,
    alpha: float,
    delta: float,
    candidates: Sequence[float] | ArrayLike | None = None,
    bound: Literal["betting", "clopper-pearson", "normal"] = "betting",
    groups: ArrayLike | None = None,
    max_traces: int | None = None,
) -> SGRResult:
    """Certify a selection threshold t* = min{t ∈ 𝒯 : U(t) ≤ α} (paper eq. 35 / eq. 65).

    ``confidence`` is the gate ρ(c) (default choice: ``confidence_gate(scores)``); ``correct`` is
    1 where the verdict matches φ*. A trace is selected when ρ ≥ t; the selective risk is per trace. ``candidates``
    𝒯 must be fixed before seeing the calibration data (default ``DEFAULT_CANDIDATES``). δ is split uniformly,
    δ' = δ/|𝒯|, over *all* candidates (Bonferroni, eqs. 67–68), and every candidate is tested (no binary
    search, so a non-monotone bound cannot hide a feasible t). The smallest feasible threshold has the largest
    coverage among certified candidates.

    ``bound="betting"`` (default): the bound over base items (:mod:`sift.metrics.betting`, docs/design.md §7),
    valid when base items are independent draws however their traces are correlated; ``groups`` gives the base
    item of every trace and ``max_traces`` bounds the traces of one item (default: the sample's largest item).
    ``"clopper-pearson"``: the paper's exact binomial bound, valid only for independent traces (Thm. K.8);
    ``"normal"``: the asymptotic bound of eq. 34.
    """
    rho = as_finite("confidence", confidence)
    ok = as_binary("correct", correct)
    n = same_length(confidence=rho, correct=ok)
    check_unit("alpha", alpha, open_interval=True)
    check_unit("delta", delta, open_interval=True)
    check_bound(bound)
    ts = candidate_grid(candidates)
    k = ts.size
    cb = candidate_bounds(rho, ok, ts, alpha, delta / k, bound, groups, max_traces)
    n_sel, e_sel, ub = cb.n_selected, cb.errors, cb.bound
    with np.errstate(invalid="ignore", divide="ignore"):
        risk = np.where(n_sel > 0, e_sel / np.maximum(n_sel, 1), np.nan)
    coverage = n_sel / n if n else np.zeros(k)
    curve = RiskCoverageCurve(ts, coverage, risk, np.where(np.isinf(ub) | (n_sel == 0), np.nan, ub), n_sel)
    hits = np.flatnonzero(cb.certified)
    if hits.size == 0:
        if n == 0:
            reason = "SGR infeasible: empty calibration set"
        else:
            best = np.nanmin(curve.bound) if np.isfinite(curve.bound).any() else math.nan
            unit = f"{cb.n_items} base items, {n} traces" if bound in ITEM_BOUNDS else f"n={n}"
            reason = (
                f"SGR infeasible: no candidate threshold has a {bound} bound <= alpha={alpha} "
                f"(delta'={delta / k:.3g} over {k} candidates, {unit}; smallest bound {best:.4g})"
            )
        undefined(reason)
        return SGRResult(math.inf, 0.0, math.nan, math.nan, 0, False, reason, curve, bound, cb.n_items)
    i = int(hits[0])
    return SGRResult(
        threshold=float(ts[i]),
        coverage=float(coverage[i]),
        selective_risk=float(risk[i]),
        bound_value=float(ub[i]),
        n_selected=int(n_sel[i]),
        feasible=True,
        reason="",
        curve=curve,
        bound=bound,
        n_items=cb.n_items,
    )


def _packaged_defaults() -> dict:
    """``configs/sgr/default.yaml``: the one place the SGR and matched-coverage defaults are written."""
    from omegaconf import OmegaConf

    from sift.resources import config_dir

    path = config_dir() / "sgr" / "default.yaml"
    values = OmegaConf.to_container(OmegaConf.load(path))
    missing = sorted({"alpha", "delta", "bound", "alphas", "match_coverage"} - set(values or {}))
    if missing:
        raise SiftError(f"{path}: missing key(s) {missing}")
    return values


#: the packaged SGR defaults (α, δ, bound, Table 3's α list, matched coverage κ), read from configs/sgr/default.yaml
SGR_DEFAULTS = _packaged_defaults()


@dataclass(frozen=True)
class SelectiveConfig:
    """The report's SGR settings (``configs/sgr``, docs/design.md §7): target risk α, failure probability δ, bound
    (``betting``: over base items, the default; ``clopper-pearson`` / ``normal``: the paper's trace-level bounds),
    candidate grid (None: :data:`DEFAULT_CANDIDATES`), the most traces one base item may hold (None: the
    calibration sample's largest item), the α's the selective-risk table certifies at and the matched-coverage
    operating point κ. Defaults: :data:`SGR_DEFAULTS`. Every certificate of the report, its appendix and its
    callbacks is computed by :meth:`run` or :meth:`threshold` with these settings."""

    alpha: float = float(SGR_DEFAULTS["alpha"])
    delta: float = float(SGR_DEFAULTS["delta"])
    bound: str = str(SGR_DEFAULTS["bound"])
    candidates: tuple[float, ...] | None = None
    max_traces: int | None = None
    alphas: tuple[float, ...] = tuple(float(a) for a in SGR_DEFAULTS["alphas"])
    match_coverage: float = float(SGR_DEFAULTS["match_coverage"])

    @classmethod
    def of(cls, node: object) -> SelectiveConfig:
        """From an SGR node (``configs/sgr``: a dict, DictConfig or object with ``alpha``, ``delta``, ``bound``,
        ``candidates``, ``max_traces``, ``alphas``, ``match_coverage``; a missing key keeps the default); a
        SelectiveConfig is returned as is."""
        if isinstance(node, SelectiveConfig):
            return node

        def get(key: str) -> object:
            if isinstance(node, dict) or hasattr(node, "get"):
                return node.get(key)  # type: ignore[union-attr]
            return getattr(node, key, None)

        base = cls()
        alpha, delta, bound, cands, most, alphas, kappa = (get(k) for k in (
            "alpha", "delta", "bound", "candidates", "max_traces", "alphas", "match_coverage"))
        return cls(base.alpha if alpha is None else float(alpha),  # type: ignore[arg-type]
                   base.delta if delta is None else float(delta),  # type: ignore[arg-type]
                   base.bound if bound is None else check_bound(str(bound)),
                   tuple(float(c) for c in cands) if cands else None,  # type: ignore[union-attr]
                   None if most is None else int(most),  # type: ignore[call-overload]
                   base.alphas if alphas is None else tuple(float(a) for a in alphas),  # type: ignore[union-attr]
                   base.match_coverage if kappa is None else float(kappa))  # type: ignore[arg-type]

    def run(self, rho: ArrayLike, correct: ArrayLike, items: ArrayLike | None, alpha: float | None = None
            ) -> SGRResult:
        """SGR on calibration traces (gate ρ, 1[verdict = φ*], base item of each; ``alpha`` overrides α), with
        undefined-metric warnings silenced (an infeasible certificate says why in ``reason``)."""
        import warnings

        from sift.metrics.checks import UndefinedMetricWarning

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UndefinedMetricWarning)
            return sgr(rho, correct, self.alpha if alpha is None else alpha, self.delta,
                       None if self.candidates is None else list(self.candidates), self.bound,  # type: ignore
                       groups=items, max_traces=self.max_traces)

    def threshold(self, rho: ArrayLike, correct: ArrayLike, items: ArrayLike | None, alpha: float | None = None
                  ) -> float:
        """The threshold :meth:`run` certifies (+inf when infeasible), without the curve, the bound values or the
        input checks: the same kernel (:func:`candidate_bounds`), for bootstrap loops."""
        ts = candidate_grid(self.candidates)
        a = self.alpha if alpha is None else alpha
        cb = candidate_bounds(np.asarray(rho, float), np.asarray(correct, int), ts, a, self.delta / ts.size,
                              self.bound, items, self.max_traces, values=False)
        hits = np.flatnonzero(cb.certified)
        return math.inf if hits.size == 0 else float(ts[hits[0]])


#: the defaults of :class:`SelectiveConfig` (``configs/sgr/default.yaml`` sets the job's)
DEFAULT_SGR = SelectiveConfig()


def select_top(confidence: ArrayLike, coverage: float) -> np.ndarray:
    """Boolean mask of the traces a coverage-κ operating point certifies (coverage-matched selection, paper
    App. C.7.3): ρ ≥ the ⌈κn⌉-th largest ρ (:func:`sift.metrics.operating.coverage_threshold`). Traces tied
    with that value are all kept (the tie rule of :mod:`sift.metrics.operating`), so ≥ ⌈κn⌉ traces are kept
    when ρ ties; κ = 0 keeps none."""
    rho = as_finite("confidence", confidence)
    check_unit("coverage", coverage)
    if coverage == 0 or rho.size == 0:
        return np.zeros(rho.size, dtype=bool)
    return rho >= coverage_threshold(rho, coverage)


def top_coverage_counts(confidence: np.ndarray, correct: np.ndarray, coverage: float) -> tuple[int, int]:
    """Kernel of the coverage-indexed selective risk: (errors, size) of the traces :func:`select_top` keeps at
    ``coverage``; the risk is errors / size."""
    keep = select_top(confidence, coverage)
    n = int(keep.sum())
    return int(n - np.asarray(correct)[keep].sum()), n


def risk_at_coverage(confidence: ArrayLike, correct: ArrayLike, coverage: float) -> float:
    """Empirical selective risk (error rate) among the traces certified at ``coverage`` (:func:`select_top`).

    This is the coverage-indexed risk–coverage curve (the paper's Fig. 9 x-axis); no threshold is
    certified here, see :func:`sgr` for that. Zero selected traces: NaN with a warning.
    """
    ok = as_binary("correct", correct)
    rho = as_finite("confidence", confidence)
    same_length(confidence=rho, correct=ok)
    errors, n = top_coverage_counts(rho, ok, coverage)
    if n == 0:
        return undefined(f"selective risk undefined at coverage {coverage}: no trace selected")
    return errors / n


def risk_upper_bound(correct: ArrayLike, delta: float, bound: Literal["betting", "clopper-pearson", "normal"] =
                     "betting", groups: ArrayLike | None = None, max_traces: int | None = None,
                     tune_at: float | None = None) -> float:
    """One-sided (1 − δ) upper confidence bound on the per-trace error rate of the traces ``correct`` (1 = right)
    with the kernel SGR uses (:func:`candidate_bounds`): over base items (``groups``) for ``"betting"``, whose
    bets are tuned to test the rate ``tune_at`` (default: the packaged α); over traces for the trace-level bounds.
    NaN with a warning
    when no trace is given."""
    ok = as_binary("correct", correct)
    check_unit("delta", delta, open_interval=True)
    tune_at = float(SGR_DEFAULTS["alpha"]) if tune_at is None else tune_at
    check_unit("tune_at", tune_at, open_interval=True)
    check_bound(bound)
    if ok.size == 0:
        return undefined("risk bound undefined: no selected traces")
    cb = candidate_bounds(np.ones(ok.size), ok, np.array([0.0]), tune_at, delta, bound, groups, max_traces)
    return float(cb.bound[0])
