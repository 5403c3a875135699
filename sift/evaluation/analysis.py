"""The one view of a run, shared by the report tables and the appendix analyses: aligned pair arrays, fast
resampled metrics, SGR.

A :class:`RunData` is the view of one run's rows of the aligned
:class:`~sift.evaluation.engine.PredictionTable` (its traces and the verified pairs whose two traces it has),
encoded against a common list of base items so that the cluster bootstrap can resample base items once for
all runs of a table (paper §7.1: 1,000 resamples stratified by base item). ``RunData.stats(items)`` computes
every per-run number on the traces and pairs of the drawn base items (with multiplicity). A :class:`SeedStack`
is the seeds of one detector stacked from their RunData views (what the appendix analyses read); its
:class:`PairRows` are its first view's pairs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sift.errors import SiftError
from sift.evaluation.predictions import Pairs, Predictions
from sift.metrics import SGRResult
from sift.metrics.bootstrap import ClusterRows, bootstrap_drawn
from sift.metrics.classification import auroc_kernel
from sift.metrics.invariance import ivr_pooled, ivr_update
from sift.metrics.operating import OperatingMetrics, OperatingPoint, PairArrays, operating_metrics
from sift.metrics.selective import SelectiveConfig, gate

NAN = math.nan


def bound_unit(selective: SelectiveConfig) -> str:
    """The report's words for an SGR bound and its unit (every certificate footnote states it)."""
    from sift.metrics.selective import ITEM_BOUNDS

    if selective.bound in ITEM_BOUNDS:
        return (f"{selective.bound} bound over base items (unit: base item, however an item's traces are "
                f"correlated; docs/design.md §7)")
    return (f"trace-level {selective.bound} bound (unit: trace; valid only for independent traces, which the "
            f"traces of one base item are not)")


class Items:
    """A fixed list of base items (cluster ids) and, per table of rows, the rows of each item (CSR)."""

    def __init__(self, names: Sequence[str]):
        self.names = np.array(sorted(set(map(str, names))), dtype=object)
        self.code = {n: i for i, n in enumerate(self.names.tolist())}

    def __len__(self) -> int:
        return len(self.names)

    def index(self, row_items: Sequence[str]) -> ClusterRows:
        """The rows of each item (by item code) of a table whose row i belongs to item ``row_items[i]``."""
        codes = np.array([self.code[str(b)] for b in row_items], dtype=np.int64)
        return ClusterRows(codes, len(self))


@dataclass(eq=False)
class RunData:
    """One run's traces and aligned pairs: a view of its rows of the
    :class:`~sift.evaluation.engine.PredictionTable` (built by ``PredictionTable.run_data``), with pair rows
    local to the run. ``run`` is the source run (seed, meta); ``t_star`` is the SGR threshold on ρ (inf if
    infeasible)."""

    run: Predictions
    axes: list[str]
    trace_id: np.ndarray
    item: np.ndarray
    label: np.ndarray
    prob: np.ndarray
    verdict: np.ndarray
    rho: np.ndarray
    sgr: SGRResult | None = None
    t_star: float = math.inf
    # pair arrays (pairs with both traces in the run), rows local to the run
    p_src: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    p_dst: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    p_axis: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # index into axes, -1: altering
    p_alt: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # altering pair with a label change
    p_items: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))
    p_ylab: tuple[np.ndarray, np.ndarray] = field(default_factory=lambda: (np.zeros(0, int), np.zeros(0, int)))
    p_kind: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))  # preserving / altering
    p_axis_name: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))
    trace_index: ClusterRows | None = None
    pair_index: ClusterRows | None = None
    # per trace: the table rows, domain, model and condition (what the appendix analyses group by)
    rows: np.ndarray | None = None
    domain: np.ndarray | None = None
    model: np.ndarray | None = None
    condition: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.trace_id.size)

    @property
    def correct(self) -> np.ndarray:
        return (self.verdict == self.label).astype(int)

    def row_of(self) -> dict[str, int]:
        """trace_id → run-local row."""
        return {t: i for i, t in enumerate(self.trace_id.tolist())}

    def set_pairs(self, src: np.ndarray, dst: np.ndarray, axis: np.ndarray, kind: np.ndarray, phi_src: np.ndarray,
                  phi_dst: np.ndarray, items: np.ndarray) -> None:
        """The run's pairs (run-local source/shifted rows), coded for the statistics."""
        lookup = {a: i for i, a in enumerate(self.axes)}
        self.p_src, self.p_dst = src, dst
        self.p_axis = np.array([lookup.get(str(a), -1) if k == "preserving" else -1 for a, k in zip(axis, kind)],
                               dtype=np.int64)
        self.p_alt = (kind == "altering") & (phi_src != phi_dst)
        self.p_ylab = (phi_src, phi_dst)
        self.p_items = items
        self.p_kind, self.p_axis_name = kind, axis

    def certify(self, cfg: SelectiveConfig, calib: RunData | None = None) -> RunData:
        """SGR threshold on ρ calibrated on ``calib`` (the same detector and seed on e.g. the validation split)
        or, without it, on this run's own traces (in-sample, as the paper's Table 3 reports it)."""
        src = calib if calib is not None else self
        self.sgr = cfg.run(src.rho, src.correct, src.item)
        self.t_star = self.sgr.threshold if self.sgr.feasible else math.inf
        return self

    def index(self, items: Items) -> RunData:
        self.trace_index = items.index(self.item)
        self.pair_index = items.index(self.p_items)
        return self

    @property
    def n_pairs(self) -> int:
        return int(self.p_src.size)

    # -------------------------------------------------------------------------------------------- statistics
    def pair_arrays(self, prow: np.ndarray) -> tuple[PairArrays, PairArrays]:
        """The preserving pairs (with a known axis) and the verified altering pairs among pair rows ``prow``."""
        pres, alt = prow[self.p_axis[prow] >= 0], prow[self.p_alt[prow]]
        return (PairArrays(self.p_src[pres], self.p_dst[pres], axis=self.p_axis[pres]),
                PairArrays(self.p_src[alt], self.p_dst[alt], label_src=self.p_ylab[0][alt],
                           label_dst=self.p_ylab[1][alt]))

    def at(self, point: OperatingPoint, trow: np.ndarray, prow: np.ndarray) -> OperatingMetrics:
        """IVR/AS/κ/MFS at an operating point (:mod:`sift.metrics.operating`) on trace rows ``trow`` (κ's
        population) and pair rows ``prow``."""
        pres, alt = self.pair_arrays(prow)
        return operating_metrics(point, self.rho[trow], self.verdict, self.rho, pres, alt, len(self.axes))

    def stats(self, drawn: np.ndarray | None = None) -> dict[str, Any]:
        """Every per-run number on the traces/pairs of the drawn items (None: all)."""
        trow = self.trace_index.rows(drawn) if self.trace_index is not None else np.arange(len(self))
        prow = self.pair_index.rows(drawn) if self.pair_index is not None else np.arange(self.n_pairs)
        out: dict[str, Any] = {"auroc": auroc_kernel(self.prob[trow], self.label[trow]) if trow.size else NAN}
        pres, alt = self.pair_arrays(prow)

        def at(point: OperatingPoint) -> OperatingMetrics:
            return operating_metrics(point, self.rho[trow], self.verdict, self.rho, pres, alt, len(self.axes))

        full = at(OperatingPoint.full())
        out.update(ivr_axes=full.ivr_axes, ivr=full.ivr, as_=full.as_, mfs=full.mfs,
                   ivr_pooled=ivr_pooled(*ivr_update(self.verdict[pres.src], self.verdict[pres.dst], pres.axis,
                                                     len(self.axes))))
        if self.sgr is not None:
            cert = at(OperatingPoint.sgr(self.t_star, self.sgr.feasible))
            out.update(coverage=cert.coverage, cert_ivr=cert.ivr, cert_as=cert.as_, cert_mfs=cert.mfs,
                       feasible=float(self.sgr.feasible))
        return out


@dataclass(eq=False)
class PairRows:
    """Pairs of one kind whose both traces a stack has, as row indices into the stack."""

    src: np.ndarray
    dst: np.ndarray
    axis: np.ndarray
    base_item: np.ndarray
    phi_src: np.ndarray
    phi_dst: np.ndarray
    source_id: np.ndarray
    shifted_id: np.ndarray

    def __len__(self) -> int:
        return len(self.src)

    def subset(self, mask: np.ndarray) -> PairRows:
        return PairRows(*(getattr(self, f)[mask] for f in self.__dataclass_fields__))

    def arrays(self, rows: np.ndarray, labels: tuple[np.ndarray, np.ndarray] | None = None,
               mask: np.ndarray | None = None) -> PairArrays:
        """The pairs at ``rows`` for :func:`sift.metrics.operating.operating_metrics` (every preserving pair in one
        pooled axis): ``labels`` (before, after; per pair) replace the verified labels (label noise; AS counts
        the pairs whose labels differ), ``mask`` (per pair) keeps a subset."""
        if mask is not None:
            rows = rows[mask[rows]]
        lb, la = (self.phi_src, self.phi_dst) if labels is None else labels
        return PairArrays(self.src[rows], self.dst[rows], label_src=lb[rows], label_dst=la[rows])


@dataclass(eq=False)
class SeedStack:
    """The seeds of one detector stacked from their :class:`RunData` views (``views``, one per seed) and aligned
    on the traces all of them cover, in the first seed's order: ``cols[s]`` are seed s's rows of its view,
    ``prob``/``verdict``/``rho`` are [S, N]. Built by :meth:`of` (``PredictionTable.stack``); its pairs are the
    first view's (:meth:`pair_rows`)."""

    name: str
    trace_id: np.ndarray
    base_item: np.ndarray
    domain: np.ndarray
    model: np.ndarray
    condition: np.ndarray
    label: np.ndarray
    prob: np.ndarray
    threshold: np.ndarray  # [S]
    seeds: list
    views: list[RunData]
    cols: np.ndarray  # [S, N]

    @classmethod
    def of(cls, name: str, views: Sequence[RunData]) -> SeedStack:
        """Stack the seed views of one detector (the first carries the pairs) on the traces all of them cover."""
        if not views:
            raise SiftError(f"{name}: no predictions")
        ref = views[0]
        common = set(ref.trace_id.tolist())
        for v in views[1:]:
            common &= set(v.trace_id.tolist())
        keep = np.array([t in common for t in ref.trace_id.tolist()], bool)
        if not keep.any():
            raise SiftError(f"{name}: the seeds share no trace")
        tid = ref.trace_id[keep]
        cols = []
        for v in views:
            where = v.row_of()
            c = np.array([where[t] for t in tid.tolist()], int)
            if not np.array_equal(v.label[c], ref.label[keep]):
                raise SiftError(f"{name}: seeds {ref.run.seed} and {v.run.seed} disagree on verified labels")
            cols.append(c)
        return cls(name, tid, ref.item[keep], ref.domain[keep], ref.model[keep], ref.condition[keep], ref.label[keep],
                   np.array([v.prob[c] for v, c in zip(views, cols)]), np.array([v.run.threshold for v in views],
                                                                                  float),
                   [v.run.seed for v in views], list(views), np.array(cols))

    @property
    def verdict(self) -> np.ndarray:
        return (self.prob >= self.threshold[:, None]).astype(int)

    @property
    def rho(self) -> np.ndarray:
        return gate(self.prob)

    @property
    def n_seeds(self) -> int:
        return self.prob.shape[0]

    @property
    def rows(self) -> np.ndarray:
        """The prediction-table rows of each seed's traces ([S, N])."""
        return np.array([v.rows[c] for v, c in zip(self.views, self.cols)])

    def index(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.trace_id.tolist())}

    def subset(self, keep: np.ndarray) -> SeedStack:
        """The stack on its traces at ``keep`` (indices or a mask)."""
        return SeedStack(self.name, self.trace_id[keep], self.base_item[keep], self.domain[keep], self.model[keep],
                         self.condition[keep], self.label[keep], self.prob[:, keep], self.threshold, self.seeds,
                         self.views, self.cols[:, keep])

    def with_prob(self, prob: np.ndarray, threshold: np.ndarray, name: str | None = None) -> SeedStack:
        return SeedStack(name or self.name, self.trace_id, self.base_item, self.domain, self.model, self.condition,
                         self.label, np.atleast_2d(prob), np.atleast_1d(threshold), self.seeds, self.views, self.cols)

    def pair_rows(self, kind: str) -> PairRows:
        """The verified pairs of one kind (``preserving`` / ``altering``) with both traces in the stack, as rows of
        the stack, in pair order."""
        v = self.views[0]
        at = np.full(len(v), -1, dtype=np.int64)
        at[self.cols[0]] = np.arange(self.cols.shape[1])
        keep = (v.p_kind == kind) & (at[v.p_src] >= 0) & (at[v.p_dst] >= 0)
        src, dst = v.p_src[keep], v.p_dst[keep]
        return PairRows(at[src], at[dst], v.p_axis_name[keep].astype(str), v.p_items[keep].astype(str),
                        v.p_ylab[0][keep], v.p_ylab[1][keep], v.trace_id[src].astype(str),
                        v.trace_id[dst].astype(str))


def seed_mean(values: Sequence[float | None]) -> float:
    """Mean over seeds of per-seed values, NaN/None seeds left out (NaN if none is left): how every table and
    appendix analysis aggregates a detector's seeds."""
    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    return float(v.mean()) if v.size else NAN


def split_strata(items: Items, splits: Sequence[Sequence[Predictions]]) -> np.ndarray | None:
    """Stratum of every item for :func:`bootstrap_vector`: items in the same set of evaluated splits (each entry
    of ``splits`` = the runs on one split) share a stratum, so every replicate keeps each split's item count.
    None when all items are in every split (one stratum)."""
    member = np.zeros((len(items), len(splits)), dtype=bool)
    for k, runs in enumerate(splits):
        for p in runs:
            member[[items.code[str(b)] for b in set(p.base_item.tolist())], k] = True
    _, sid = np.unique(member, axis=0, return_inverse=True)
    sid = np.asarray(sid).reshape(-1)
    return None if np.unique(sid).size <= 1 else sid


def bootstrap_vector(fn: Callable[[np.ndarray | None], np.ndarray], n_items: int, n_resamples: int,
                     seed: int = 0, confidence: float = 0.95,
                     strata: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Estimate and percentile CI of every component of a vector statistic of the drawn base items
    (:func:`sift.metrics.bootstrap.bootstrap_drawn`, the one bootstrap engine).

    The pool is the ``n_items`` items of the evaluated split(s) (never the whole corpus), stratified by
    ``strata`` (see :func:`split_strata`) when a table mixes splits, so all components of one replicate share
    the same resample. ``fn(None)`` is the full-data estimate. With ``n_resamples=0`` the CI is NaN.
    """
    est, _, low, high = bootstrap_drawn(fn, n_items, max(n_resamples, 0), seed, confidence, strata)
    return est, low, high


def common_items(*preds_lists: Sequence[Predictions], pairs: Pairs | None = None) -> Items:
    """The base items of the given runs (the bootstrap pool). ``pairs`` adds the items of every pair, i.e. of the
    whole corpus: the tables never pass it (docs/design.md §7: resample the items of the split being evaluated)."""
    names: set[str] = set()
    for lst in preds_lists:
        for p in lst:
            names.update(map(str, p.base_item.tolist()))
    if pairs is not None:
        names.update(map(str, pairs.base_item.tolist()))
    return Items(sorted(names))


def preserving_axes(pairs: Pairs | None, order: Sequence[str] | None = None) -> list[str]:
    """Preserving axes present in ``pairs`` (FaithShift order first, then alphabetical)."""
    if pairs is None or len(pairs) == 0:
        return []
    present = {str(a) for a, k in zip(pairs.axis, pairs.kind) if k == "preserving"}
    if order is None:
        try:
            from sift.corpus.axes import AXES as order  # type: ignore[no-redef]
        except Exception:  # pragma: no cover
            order = []
    first = [a for a in order if a in present]
    return first + sorted(present - set(first))


def ensemble_row(name: str) -> str:
    """The table row of detector ``name``'s seed ensemble."""
    return f"{name} (ensemble)"


def is_ensemble_row(runs: Sequence[Predictions]) -> bool:
    """A row of seed ensembles (every run has seed None)."""
    return bool(runs) and all(p.seed is None for p in runs)


def group_runs(runs: dict[str, list[Predictions]]) -> dict[str, list[Predictions]]:
    """Rows of a table: each detector's seed runs under its name; runs with seed None (seed ensembles) under
    :func:`ensemble_row` of it, unless they are the only runs of that name and their run spec names another
    detector as their members' (:attr:`Predictions.ensemble_of`: an ensemble file named e.g. ``sift_ensemble``)."""
    out: dict[str, list[Predictions]] = {}
    for name, lst in runs.items():
        if not isinstance(lst, (list, tuple)):
            lst = [lst]
        seeds = [p for p in lst if p.seed is not None]
        ens = [p for p in lst if p.seed is None]
        if seeds:
            out.setdefault(name, []).extend(seeds)
        if ens:  # a run named after its members' detector (or of unknown members) is that detector's ensemble row
            own = not seeds and all(p.ensemble_of not in (None, name) for p in ens)
            en = name if own else ensemble_row(name)
            out.setdefault(en, []).extend(ens)
    return {k: v for k, v in out.items() if v}


def match_calibration(run: Predictions, calib: dict[str, list[Predictions]] | None, name: str) -> Predictions | None:
    """The calibration (validation) predictions of the same detector and seed, if given."""
    if not calib:
        return None
    cands = calib.get(name) or calib.get(run.detector) or []
    if not isinstance(cands, (list, tuple)):
        cands = [cands]
    for c in cands:
        if c.seed == run.seed:
            return c
    return None


def ensemble_threshold(members: Sequence[Predictions],
                       val: Sequence[Predictions | None] | None = None) -> tuple[float, str]:
    """The one rule for an ensemble's decision threshold (Table 8's seed ensembles, the instance ensemble and the
    factorial analysis's ensemble cells): Youden's J on the probability average of the members' validation
    predictions (``val``, one per member, in member order) when every member has them, else the mean of the
    members' own thresholds. Returns the threshold and how it was set."""
    import warnings

    from sift.detectors.thresholds import fit_threshold
    from sift.evaluation.predictions import average

    if val and all(v is not None for v in val):
        avg = average(list(val), "ensemble (validation)", 0.5)  # type: ignore[arg-type]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fit_threshold(avg.prob, avg.label, "youden"), "youden on averaged validation predictions"
    return float(np.mean([m.threshold for m in members])), \
        "mean of the members' thresholds (no validation predictions given)"


def seed_ensemble(name: str, seeds: Sequence[Predictions], val: dict[str, list[Predictions]] | None) -> Predictions:
    """The seed ensemble of detector ``name``: the probability average of ``seeds`` (aligned on the first seed's
    trace order), its threshold by :func:`ensemble_threshold` from the members' validation predictions in ``val``
    (matched by detector and seed); ``meta['threshold_from']`` says how."""
    from sift.evaluation.predictions import average

    members = sorted(seeds, key=lambda p: p.seed)
    order = members[0].trace_id
    aligned = []
    for m in members:
        if not np.array_equal(m.trace_id, order):
            idx = m.index()
            m = m.subset(np.array([idx[t] for t in order.tolist()]))
        aligned.append(m)
    thr, how = ensemble_threshold(members, [match_calibration(m, val, name) for m in members])
    ens = average(aligned, f"{name} (ensemble)", thr)
    ens.meta["threshold_from"] = how
    return ens


#: the split that calibrates SGR: disjoint (by base item) from the validation part that selects the checkpoint
#: and fits the decision threshold (docs/design.md §7)
CALIB_SPLIT = "calib"


def calibration_source(calib: dict[str, list[Predictions]] | None) -> str:
    """How SGR was calibrated, for the report: the split name, and whether it is a valid certificate."""
    if not calib:
        return "in-sample on the evaluated split (descriptive, not a certificate)"
    splits = sorted({p.split for lst in calib.values() for p in (lst if isinstance(lst, (list, tuple)) else [lst])})
    if splits == [CALIB_SPLIT]:
        return (f"on the '{CALIB_SPLIT}' split (validation items held out from checkpoint selection and the "
                f"threshold)")
    return (f"on split {', '.join(splits)} (not disjoint from checkpoint selection / threshold fitting if this is "
            f"the validation split those used: not a valid certificate)")


def check_same_split(runs: dict[str, list[Predictions]]) -> None:
    splits = {p.split for lst in runs.values() for p in lst}
    if len(splits) > 1:
        raise SiftError(f"runs mix predictions of several splits {sorted(splits)}; pass one split per table")


def num(v: Any) -> float | None:
    """JSON-friendly number (NaN/inf → None)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None
