"""The evaluation engine: the report's options, the aligned prediction table and the context every report
section reads.

:class:`ReportContext` is built once per report from all predictions (every run, split and transfer setting)
and the verified pairs. It holds the aligned per-trace table (:class:`PredictionTable`: one row per trace of
every run, with run, detector, seed, split, base item, condition, label, probability, verdict, gate) and the
runs grouped the ways the sections need them (the evaluated split, calibration, selection, transfer settings,
transfer matrices). Sections (:mod:`sift.evaluation.sections`) read it and never regroup predictions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from sift.errors import SiftError
from sift.evaluation.analysis import CALIB_SPLIT, RunData, SeedStack
from sift.evaluation.predictions import Pairs, Predictions
from sift.metrics.selective import SelectiveConfig

#: selective risk is reported at these coverages (paper Table 3 (a))
DEFAULT_COVERAGES = (0.05, 0.25, 0.45, 0.65, 0.85, 1.00)


def _get(node: Any, *names: str, default: Any = None) -> Any:
    """The first of ``names`` set on a mapping or attribute node (a DictConfig, a dataclass, a dict)."""
    for n in names:
        v = node.get(n) if hasattr(node, "get") else getattr(node, n, None)
        if v is not None:
            return v
    return default


@dataclass(frozen=True)
class ReportOptions:
    """What the report computes: the evaluated / calibration / selection splits, the SGR settings, the
    selective-risk grid, the reference detector, source families, the bootstrap (resamples, seed), the title and
    the matched-text slice (trace ids)."""

    split: str = "test"
    calib_split: str | None = CALIB_SPLIT
    select_split: str | None = "val"
    selective: SelectiveConfig = field(default_factory=SelectiveConfig)
    coverages: tuple[float, ...] = DEFAULT_COVERAGES
    reference: str | None = None
    families: Mapping[str, str] | None = None
    n_resamples: int = 1000
    seed: int = 0
    title: str = "sift evaluation"
    slice_ids: frozenset[str] | None = None
    #: modules defining extra registered sections (imported before the registry is read)
    section_modules: tuple[str, ...] = ()

    @classmethod
    def of(cls, *, sgr: Any = None, bootstrap: Any = None, **values: Any) -> ReportOptions:
        """Options from plain values plus, optionally, an SGR node (``alpha``, ``delta``, ``bound``,
        ``candidates``, ``max_traces``; a :class:`SelectiveConfig` is taken as is) and a bootstrap node
        (``resamples`` or ``n_resamples``, ``seed``); the nodes may be dicts, DictConfigs or dataclasses."""
        if sgr is not None:
            values["selective"] = SelectiveConfig.of(sgr)
        if bootstrap is not None:
            values.setdefault("n_resamples", int(_get(bootstrap, "resamples", "n_resamples", default=1000)))
            values.setdefault("seed", int(_get(bootstrap, "seed", default=0)))
        for k in ("coverages",):
            if k in values:
                values[k] = tuple(float(x) for x in values[k])
        if "section_modules" in values:
            values["section_modules"] = tuple(values["section_modules"])
        if values.get("slice_ids") is not None:
            values["slice_ids"] = frozenset(values["slice_ids"])
        return cls(**values)


#: the defaults (a section called outside a report)
DEFAULT_OPTIONS = ReportOptions()


# ------------------------------------------------------------------------------------------ run grouping
def run_key(p: Predictions) -> str:
    """Row name of a run: detector name, with ``[ablation]`` for ablated variants."""
    ab = p.role.ablation
    return p.detector if ab is None else f"{p.detector} [{ab}]"


def is_variant(p: Predictions) -> bool:
    """A SIFT ablation or factorial cell (:attr:`RunRole.is_variant`): reported in Table 4 / appendix F, not as
    a detector of Tables 1, 3 and 8."""
    return p.role.is_variant


def group_by_run(preds: Iterable[Predictions]) -> dict[str, list[Predictions]]:
    """Runs by :func:`run_key`, seeds ascending (ensembles last); two runs with one seed are an error."""
    out: dict[str, list[Predictions]] = {}
    for p in preds:
        out.setdefault(run_key(p), []).append(p)
    for k, v in out.items():
        v.sort(key=lambda p: (p.seed is None, p.seed if p.seed is not None else 0))
        seen = set()
        for p in v:
            if p.seed in seen:
                raise SiftError(f"detector {k!r}: two runs with seed {p.seed} on split {p.split} "
                                "(give them distinct names or seeds)")
            seen.add(p.seed)
    return out


def _ablation(p: Predictions) -> str:
    return p.role.ablation or "full"


# ------------------------------------------------------------------------------------------ the table
@dataclass(frozen=True, eq=False)
class PredictionTable:
    """Every trace of every run, aligned in one set of columns (row r = one trace of one run).

    ``run`` indexes :attr:`runs` (each run's rows are contiguous, from ``start[run]``); ``seed`` is -1 for an
    ensemble. This is the one place where predictions and verified pairs are aligned: :meth:`pairs_of` gives the
    pairs of a run as rows of the table, and the per-run (:meth:`run_data`) and per-detector seed-stack
    (:meth:`stack`, :meth:`pair_rows`) views the tables and appendix analyses compute on are index views of it.
    """

    runs: tuple[Predictions, ...]
    run: np.ndarray
    detector: np.ndarray
    seed: np.ndarray
    split: np.ndarray
    trace_id: np.ndarray
    item: np.ndarray
    domain: np.ndarray
    model: np.ndarray
    condition: np.ndarray
    label: np.ndarray
    prob: np.ndarray
    verdict: np.ndarray
    confidence: np.ndarray
    start: np.ndarray
    pairs: Pairs | None = None

    @classmethod
    def of(cls, runs: Sequence[Predictions], pairs: Pairs | None = None) -> PredictionTable:
        runs = tuple(runs)
        if len({id(p) for p in runs}) != len(runs):
            raise SiftError("PredictionTable: a run is given twice")

        def col(f: Any, dtype: Any = None) -> np.ndarray:
            parts = [np.asarray(f(i, p)) for i, p in enumerate(runs)]
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)

        start = np.concatenate([[0], np.cumsum([len(p) for p in runs])]).astype(np.int64)
        return cls(runs, col(lambda i, p: np.full(len(p), i), np.int64),
                   col(lambda i, p: np.full(len(p), run_key(p), dtype=object), object),
                   col(lambda i, p: np.full(len(p), -1 if p.seed is None else p.seed), np.int64),
                   col(lambda i, p: np.full(len(p), p.split, dtype=object), object),
                   col(lambda i, p: p.trace_id, object), col(lambda i, p: p.base_item, object),
                   col(lambda i, p: p.domain, object), col(lambda i, p: p.model, object),
                   col(lambda i, p: p.condition, object), col(lambda i, p: p.label, np.int64),
                   col(lambda i, p: p.prob, float), col(lambda i, p: p.verdict, np.int64),
                   col(lambda i, p: p.confidence, float), start, pairs)

    def __len__(self) -> int:
        return int(self.run.size)

    @cached_property
    def _position(self) -> dict[int, int]:
        return {id(p): i for i, p in enumerate(self.runs)}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_position", None)  # object ids: rebuilt after unpickling
        return state

    def index_of(self, run: int | Predictions) -> int:
        """Position of a run (given as a position or as one of :attr:`runs`)."""
        if isinstance(run, Predictions):
            pos = self._position.get(id(run))
            if pos is None:
                raise SiftError(f"run {run.detector} (seed {run.seed}, {run.split}) is not in the prediction table")
            return pos
        return int(run)

    def run_rows(self, run: int | Predictions) -> np.ndarray:
        """Row indices of one run's traces (its order)."""
        i = self.index_of(run)
        return np.arange(self.start[i], self.start[i + 1])

    def rows(self, *, split: str | None = None, detector: str | None = None) -> np.ndarray:
        """Row indices of the traces of one split and/or detector (run key)."""
        keep = np.ones(len(self), dtype=bool)
        if split is not None:
            keep &= self.split == split
        if detector is not None:
            keep &= self.detector == detector
        return np.flatnonzero(keep)

    def pairs_of(self, run: int | Predictions, pairs: Pairs | None = None) -> dict[str, np.ndarray]:
        """The verified pairs (the table's, or ``pairs``) with both traces in one run, in pair order:
        source/shifted rows of this table, axis, kind, verified labels and base item."""
        pairs = self.pairs if pairs is None else pairs
        if pairs is None or len(pairs) == 0:
            empty = np.zeros(0, dtype=np.int64)
            return {"src": empty, "dst": empty, "axis": empty.astype(object), "kind": empty.astype(object),
                    "phi_src": empty, "phi_dst": empty, "item": empty.astype(object)}
        i = self.index_of(run)
        src, dst, keep = pairs.rows(self.runs[i])
        offset = int(self.start[i])
        return {"src": src[keep] + offset, "dst": dst[keep] + offset, "axis": pairs.axis[keep],
                "kind": pairs.kind[keep], "phi_src": pairs.phi_source[keep].astype(int),
                "phi_dst": pairs.phi_shifted[keep].astype(int), "item": pairs.base_item[keep]}

    def run_data(self, run: int | Predictions, axes: Sequence[str] = (), *, paired: bool = True,
                 pairs: Pairs | None = None, keep: np.ndarray | None = None) -> RunData:
        """One run's rows as a :class:`RunData` (run-local arrays). ``paired``: with the run's pairs (the table's,
        or ``pairs``); ``keep``: only these of its traces (a boolean mask over the run's rows; no pairs then)."""
        i = self.index_of(run)
        rows = self.run_rows(i)
        if keep is not None:
            if paired:
                raise SiftError("PredictionTable.run_data: a trace subset cannot keep its pairs")
            rows = rows[np.asarray(keep, bool)]
        rd = RunData(self.runs[i], list(axes), self.trace_id[rows], self.item[rows], self.label[rows],
                     self.prob[rows], self.verdict[rows], self.confidence[rows], rows=rows, domain=self.domain[rows],
                     model=self.model[rows], condition=self.condition[rows])
        if paired:
            pr = self.pairs_of(i, pairs)
            offset = int(self.start[i])
            rd.set_pairs(pr["src"] - offset, pr["dst"] - offset, pr["axis"], pr["kind"], pr["phi_src"],
                         pr["phi_dst"], pr["item"])
        return rd

    def stack(self, name: str, runs: Predictions | Sequence[Predictions]) -> SeedStack:
        """The seed runs of one detector as one :class:`SeedStack` of their :meth:`run_data` views, aligned on the
        traces all of them cover (the first run's order; its view carries the pairs)."""
        runs = [runs] if isinstance(runs, Predictions) else list(runs)
        return SeedStack.of(name, [self.run_data(r, paired=k == 0) for k, r in enumerate(runs)])


def runs_table(runs: Mapping[str, Predictions | Sequence[Predictions]], pairs: Pairs | None = None,
               extra: Iterable[Predictions] = ()) -> PredictionTable:
    """The prediction table of a ``name → run(s)`` mapping (plus ``extra`` runs), each run once: how a section
    or appendix analysis given runs aligns them."""
    seen: dict[int, Predictions] = {}
    for v in (*runs.values(), list(extra)):
        for p in ([v] if isinstance(v, Predictions) else v):
            seen.setdefault(id(p), p)
    return PredictionTable.of(list(seen.values()), pairs)


# ------------------------------------------------------------------------------------------ the context
@dataclass(eq=False)
class ReportContext:
    """Everything a report section reads: the options, the verified pairs, the output folder, the aligned
    prediction table and the runs grouped by role (see :func:`sift.evaluation.run.report_from_predictions`).
    ``aligned``: the table of ``predictions`` and ``pairs`` when the caller has built it already (the main job
    shares it with the appendix analyses)."""

    predictions: list[Predictions]
    pairs: Pairs
    out_dir: Path
    options: ReportOptions = field(default_factory=ReportOptions)
    aligned: PredictionTable | None = None

    def has(self, need: str) -> bool:
        """Whether the context's ``need`` (one of a section's ``needs``: an attribute) is non-empty."""
        return bool(getattr(self, need))

    @cached_property
    def table(self) -> PredictionTable:
        """The aligned per-trace table of every run."""
        if self.aligned is not None:
            same = len(self.aligned.runs) == len(self.predictions) and all(
                a is b for a, b in zip(self.aligned.runs, self.predictions))
            if not same or self.aligned.pairs is not self.pairs:
                raise SiftError("ReportContext: the given prediction table is not that of these predictions and pairs")
            return self.aligned
        return PredictionTable.of(self.predictions, self.pairs)

    @cached_property
    def _rest(self) -> list[Predictions]:
        return [p for p in self.predictions if p.role.cell is None and p.role.in_dist_of is None]

    @cached_property
    def test(self) -> dict[str, list[Predictions]]:
        """Runs on the evaluated split (no transfer setting), by run key."""
        o = self.options
        return group_by_run(p for p in self._rest if p.split == o.split and p.role.transfer_setting is None)

    @cached_property
    def calib(self) -> dict[str, list[Predictions]] | None:
        """Runs on the calibration split (they calibrate SGR), or None."""
        cs = self.options.calib_split
        return group_by_run(p for p in self._rest if cs is not None and p.split == cs) or None

    @cached_property
    def select(self) -> dict[str, list[Predictions]] | None:
        """Runs on the selection split (they freeze the thresholds of ensembles built here), or None."""
        ss = self.options.select_split
        return group_by_run(p for p in self._rest if ss is not None and p.split == ss) or None

    @cached_property
    def transfer(self) -> dict[str, dict[str, list[Predictions]]]:
        """Transfer setting → run key → runs (split ``transfer`` or a ``meta['transfer_setting']``)."""
        out: dict[str, dict[str, list[Predictions]]] = {}
        for p in self._rest:
            setting = p.role.transfer_setting
            if p.split == "transfer" or setting is not None:
                if p.split == self.options.split and setting is None:
                    continue
                out.setdefault(setting or "transfer", {}).setdefault(run_key(p), []).append(p)
        return out

    @cached_property
    def home(self) -> dict[str, dict[str, list[Predictions]]]:
        """Transfer setting → run key → the transfer runs' own in-distribution test runs (``meta['in_dist_of']``)."""
        out: dict[str, dict[str, list[Predictions]]] = {}
        for p in self.predictions:
            if p.role.in_dist_of is not None:
                out.setdefault(p.role.in_dist_of, {}).setdefault(run_key(p), []).append(p)
        return out

    @cached_property
    def primary(self) -> dict[str, list[Predictions]]:
        """The detector rows of Tables 1, 3 and 8: test runs without ablations/factorial cells (all test runs if
        every one is a variant), shortcut controls last."""
        from sift.evaluation.control_rows import order_rows

        test = self.test
        return order_rows({k: v for k, v in test.items() if not any(is_variant(p) for p in v)} or test)

    @cached_property
    def ablations(self) -> dict[str, dict[str, dict[str, list[Predictions]]]]:
        """Detector with ≥ 2 ablation variants → {"test", "transfer", "calib"} → variant → seed runs."""
        by_det: dict[str, dict[str, list[Predictions]]] = {}
        for lst in self.test.values():
            for p in lst:
                if p.seed is not None:
                    by_det.setdefault(p.detector, {}).setdefault(_ablation(p), []).append(p)
        out = {}
        for det, variants in by_det.items():
            if len(variants) < 2:
                continue
            tr: dict[str, list[Predictions]] = {}
            for setting in self.transfer.values():
                for lst in setting.values():
                    for p in lst:
                        if p.detector == det and p.seed is not None:
                            tr.setdefault(_ablation(p), []).append(p)
            cal: dict[str, list[Predictions]] | None = None
            if self.calib:
                cal = {}
                for lst in self.calib.values():
                    for p in lst:
                        if p.detector == det:
                            cal.setdefault(_ablation(p), []).append(p)
            out[det] = {"test": variants, "transfer": tr, "calib": cal}
        return out

    @cached_property
    def matrices(self) -> dict[tuple[str, str], dict[tuple[str, str], list[Predictions]]]:
        """(detector, matrix setting) → (train_on, test_on) → runs of the transfer-matrix cells."""
        out: dict[tuple[str, str], dict[tuple[str, str], list[Predictions]]] = {}
        for p in self.predictions:
            if p.role.cell is not None:
                matrix, train_on, test_on = p.role.cell
                out.setdefault((p.detector, matrix), {}).setdefault((train_on, test_on), []).append(p)
        return out
