"""The paper's appendix analyses as report sections, and a registry the main job iterates over.

Each analysis is one public function returning a :class:`sift.report.Section` (Markdown, figures under
``out_dir/figures/``, and ``results`` holding every number shown with 95 % base-item cluster-bootstrap CIs).
:data:`APPENDIX_ANALYSES` lists them with the inputs each needs; :func:`run_appendix` calls those whose
inputs are available.

Common inputs:

- ``runs``: detector name → list of per-seed :class:`~sift.evaluation.predictions.Predictions` on the test
  split (an ensemble can be its own entry with a one-element list);
- ``pairs``: :class:`~sift.evaluation.predictions.Pairs` (``Pairs.from_corpus(corpus_dir)``);
- ``traces``: :class:`~sift.evaluation.appendix_common.TraceTable` (``TraceTable.from_corpus(corpus_dir)``);
- ``out_dir``: the report folder (figures are written to ``out_dir/figures`` and referenced relatively);
- ``table``: the report's aligned :class:`~sift.evaluation.engine.PredictionTable` holding ``runs`` and ``pairs``,
  given to every analysis (each reads its seed stacks and pair rows from it; without it, each builds the table of
  its ``runs`` and ``pairs``).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppendixAnalysis:
    """One appendix analysis: ``function(**inputs, **options) -> Section``.

    ``requires``: inputs that must be present (keyword names of ``function``); ``optional``: inputs used
    when present; ``paper``: where it is in the paper.
    """

    name: str
    function: Callable[..., Section]
    requires: tuple[str, ...]
    optional: tuple[str, ...]
    paper: str


APPENDIX_ANALYSES: list[AppendixAnalysis] = [
    AppendixAnalysis("factorial", factorial_decomposition, ("runs", "pairs"), ("out_dir", "design", "ensembles"),
                     "App. F, Table 17, Fig. 18"),
    AppendixAnalysis("stability_sensitivity", stability_sensitivity, ("runs", "pairs"), ("out_dir",),
                     "App. G, Table 18, Fig. 19"),
    AppendixAnalysis("label_noise", label_noise_sensitivity, ("runs", "pairs"), ("out_dir",),
                     "App. C.8.1, Fig. 10"),
    AppendixAnalysis("theorem_bound", theorem_bound_audit, ("runs", "pairs", "traces"), ("out_dir", "extra_features"),
                     "App. C.8 Table 3b, eq. 30; App. I Table 20"),
    AppendixAnalysis("spurious_features", spurious_feature_correlations, ("runs", "pairs", "traces"),
                     ("out_dir", "extra_features"), "App. C.6, Table 9, Fig. 7"),
    AppendixAnalysis("abstention", abstention_characterisation, ("runs",), ("out_dir", "traces", "thresholds"),
                     "App. C.7.2, Table 10"),
    AppendixAnalysis("optimal_coverage", optimal_coverage, ("runs",), ("out_dir",), "App. C.7.4, eq. 43, Table 11"),
    AppendixAnalysis("mechanism", mechanism_preservation_audit, ("runs", "pairs", "traces"), ("out_dir", "scramble"),
                     "App. H, Table 19"),
]


def run_appendix(
    inputs: Mapping[str, Any],
    names: Sequence[str] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    common: Mapping[str, Any] | None = None,
) -> list[Section]:
    """Run the analyses of :data:`APPENDIX_ANALYSES` (or ``names``) whose required inputs are in ``inputs``.

    ``options[name]`` are extra keyword arguments of one analysis; ``common`` are keyword arguments passed
    to every analysis that accepts them (e.g. ``{"n_resamples": 1000, "seed": 0}``). An analysis whose
    inputs are missing is skipped with a log line; one that fails raises (the caller decides).
    """
    options = options or {}
    common = dict(common or {})
    out = []
    for a in APPENDIX_ANALYSES:
        if names is not None and a.name not in names:
            continue
        missing = [r for r in a.requires if inputs.get(r) is None]
        if missing:
            log.info("appendix %s skipped: missing %s", a.name, ", ".join(missing))
            continue
        params = inspect.signature(a.function).parameters
        kw = {k: inputs[k] for k in a.requires}
        kw.update({k: inputs[k] for k in (*a.optional, "table") if inputs.get(k) is not None})
        kw.update({k: v for k, v in common.items() if k in params})
        kw.update(options.get(a.name, {}))
        out.append(a.function(**kw))
    return out


__all__ = [
    "APPENDIX_ANALYSES",
    "ASSUMPTION_THRESHOLDS",
    "AppendixAnalysis",
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
    "run_appendix",
    "spurious_feature_correlations",
    "stability_sensitivity",
    "theorem_bound_audit",
]
