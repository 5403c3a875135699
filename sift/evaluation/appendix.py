"""The paper's appendix analyses as report sections, and a registry the main job iterates over.

Each analysis is one public function returning a :class:`sift.report.Section` (Markdown, figures under
``out_dir/figures/``, and ``results`` holding every number shown with 95 % base-item cluster-bootstrap CIs).
:data:`APPENDIX_ANALYSES` is the registry (:func:`register_analysis`): each entry names the inputs it needs, the
main job's settings it takes (``jobs``) and where it is in the paper; :func:`run_appendix` calls those whose inputs
are available. Every analysis takes ``n_resamples``, ``seed`` and ``table`` keywords besides its inputs.

Common inputs:

- ``runs``: detector name → list of per-seed :class:`~sift.evaluation.predictions.Predictions` on the test
  split (an ensemble can be its own entry with a one-element list);
- ``pairs``: :class:`~sift.evaluation.predictions.Pairs` (``Pairs.from_corpus(corpus_dir)``);
- ``val``: detector name → its main runs' validation predictions (they freeze ensemble thresholds);
- ``traces``: :class:`~sift.evaluation.appendix_common.TraceTable` (``TraceTable.from_corpus(corpus_dir)``);
- ``out_dir``: the report folder (figures are written to ``out_dir/figures`` and referenced relatively);
- ``table``: the report's aligned :class:`~sift.evaluation.engine.PredictionTable` holding ``runs`` and ``pairs``,
  given to every analysis (each reads its seed stacks and pair rows from it; without it, each builds the table of
  its ``runs`` and ``pairs``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sift.evaluation.appendix_common import TraceTable, mechanism_class
from sift.evaluation.appendix_corpus import cot_scramble_test, mechanism_preservation_audit
from sift.evaluation.appendix_detectors import (
    COST_REGIMES,
    abstention_characterisation,
    factorial_decomposition,
    label_noise_sensitivity,
    optimal_coverage,
    stability_sensitivity,
)
from sift.evaluation.appendix_theory import (
    ASSUMPTION_THRESHOLDS,
    PAIR_FEATURES,
    pair_features,
    spurious_feature_correlations,
    theorem_bound_audit,
)
from sift.report import Section
from sift.report.analysis import Analysis, Registry

log = logging.getLogger(__name__)


#: an analysis's runs in the main job: (variant name or None, the keyword options of that run), from the job's
#: config and its one SGR setting
JobsFn = Callable[[Any, Any], list[tuple[str | None, dict[str, Any]]]]


def one_job(cfg: Any, selective: Any) -> list[tuple[str | None, dict[str, Any]]]:
    """The default: one run with the analysis's own defaults."""
    return [(None, {})]


@dataclass(frozen=True)
class AppendixContext:
    """What the appendix analyses read (:class:`sift.report.analysis.Context`): the ``inputs`` (module
    docstring), the keyword arguments every analysis takes (``common``: ``n_resamples``, ``seed``) and per
    analysis its own (``options[name]``). The aligned prediction table among the inputs is built once and shared
    (every analysis reads its seed stacks and pair rows from it)."""

    inputs: Mapping[str, Any]
    common: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def has(self, need: str) -> bool:
        return self.inputs.get(need) is not None


@dataclass(frozen=True)
class AppendixAnalysis(Analysis):
    """One appendix analysis (:class:`sift.report.analysis.Analysis` of an :class:`AppendixContext`):
    ``function(**inputs, **options, n_resamples=, seed=, table=) -> Section``.

    ``requires``: inputs that must be present (its ``needs``: keyword names of ``function``); ``optional``:
    inputs used when present; ``paper``: where it is in the paper; ``jobs``: its runs in the main job
    (:data:`JobsFn`; a variant's section key is ``appendix_<name>_<variant>``).
    """

    name: str
    function: Callable[..., Section]
    requires: tuple[str, ...]
    optional: tuple[str, ...]
    paper: str
    jobs: JobsFn = one_job

    @property
    def needs(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.requires

    def build(self, ctx: AppendixContext) -> list[Section]:
        kw = {k: ctx.inputs[k] for k in self.requires}
        kw.update({k: ctx.inputs[k] for k in (*self.optional, "table") if ctx.inputs.get(k) is not None})
        kw.update(ctx.common)
        kw.update(ctx.options.get(self.name, {}))
        return [self.function(**kw)]


#: the registry, in report order (registration order)
APPENDIX_ANALYSES: Registry[AppendixAnalysis] = Registry("appendix analysis")


def register_analysis(analysis: AppendixAnalysis) -> AppendixAnalysis:
    """Add an appendix analysis (its ``name`` must be new); the main job runs it after the built-ins (a module
    that registers one is listed in ``report.section_modules``)."""
    return APPENDIX_ANALYSES.register(analysis)


def _factorial_jobs(cfg: Any, selective: Any) -> list[tuple[str | None, dict[str, Any]]]:
    """One factorial analysis per design of the detector registry
    (:func:`sift.detectors.registry.factorial_designs`); a second design is the variant named by its other
    architecture."""
    from sift.detectors.registry import detector_entries, factorial_designs, reference_detector

    entries = detector_entries(cfg.detectors)
    designs = factorial_designs(entries, reference_detector(entries))
    jobs: list[tuple[str | None, dict[str, Any]]] = [
        (None, {"coverage": selective.match_coverage, "design": designs[0] if designs else None})]
    jobs += [(next(iter(d.values()))[0], {"coverage": selective.match_coverage, "design": d}) for d in designs[1:]]
    return jobs


def _certifying(cfg: Any, selective: Any) -> list[tuple[str | None, dict[str, Any]]]:
    """Analyses that certify take the job's SGR setting."""
    return [(None, {"selective": selective})]


for _analysis in (
    AppendixAnalysis("factorial", factorial_decomposition, ("runs", "pairs"),
                     ("out_dir", "design", "ensembles", "val"),
                     "App. F, Table 17, Fig. 18", _factorial_jobs),
    AppendixAnalysis("stability_sensitivity", stability_sensitivity, ("runs", "pairs"), ("out_dir",),
                     "App. G, Table 18, Fig. 19",
                     lambda cfg, sel: [(None, {"coverages": (None, sel.match_coverage)})]),
    AppendixAnalysis("label_noise", label_noise_sensitivity, ("runs", "pairs"), ("out_dir",),
                     "App. C.8.1, Fig. 10", _certifying),
    AppendixAnalysis("theorem_bound", theorem_bound_audit, ("runs", "pairs", "traces"), ("out_dir", "extra_features"),
                     "App. C.8 Table 3b, eq. 30; App. I Table 20"),
    AppendixAnalysis("spurious_features", spurious_feature_correlations, ("runs", "pairs", "traces"),
                     ("out_dir", "extra_features"), "App. C.6, Table 9, Fig. 7"),
    AppendixAnalysis("abstention", abstention_characterisation, ("runs",), ("out_dir", "traces", "thresholds"),
                     "App. C.7.2, Table 10", _certifying),
    AppendixAnalysis("optimal_coverage", optimal_coverage, ("runs",), ("out_dir",), "App. C.7.4, eq. 43, Table 11"),
    AppendixAnalysis("mechanism", mechanism_preservation_audit, ("runs", "pairs", "traces"), ("out_dir", "scramble"),
                     "App. H, Table 19"),
):
    register_analysis(_analysis)


def run_appendix(
    inputs: Mapping[str, Any],
    names: Sequence[str] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    common: Mapping[str, Any] | None = None,
) -> list[Section]:
    """Run the analyses of :data:`APPENDIX_ANALYSES` (or ``names``) whose required inputs are in ``inputs``.

    ``options[name]`` are extra keyword arguments of one analysis; ``common`` are the keyword arguments every
    analysis takes (``n_resamples``, ``seed``). An analysis whose
    inputs are missing is skipped with a log line; one that fails raises (the caller decides).
    """
    ctx = AppendixContext(inputs, dict(common or {}), dict(options or {}))
    out: list[Section] = []
    for a in APPENDIX_ANALYSES:
        if names is not None and a.name not in names:
            continue
        if not a.applies(ctx):
            log.info("appendix %s skipped: missing %s", a.name, ", ".join(r for r in a.requires if not ctx.has(r)))
            continue
        out.extend(a.build(ctx))
    return out


__all__ = [
    "APPENDIX_ANALYSES",
    "ASSUMPTION_THRESHOLDS",
    "AppendixAnalysis",
    "AppendixContext",
    "JobsFn",
    "COST_REGIMES",
    "PAIR_FEATURES",
    "TraceTable",
    "abstention_characterisation",
    "cot_scramble_test",
    "factorial_decomposition",
    "label_noise_sensitivity",
    "mechanism_class",
    "mechanism_preservation_audit",
    "optimal_coverage",
    "pair_features",
    "register_analysis",
    "run_appendix",
    "spurious_feature_correlations",
    "stability_sensitivity",
    "theorem_bound_audit",
]
