"""Detectors vs the shortcut controls on the matched-text slice
(:func:`sift.evaluation.control_rows.matched_slice_section`), when the report is given the slice's trace ids."""

from __future__ import annotations

from sift.evaluation.control_rows import matched_slice_section
from sift.evaluation.engine import ReportContext
from sift.evaluation.sections.registry import ReportSection, register_section
from sift.report import Section


@register_section
class MatchedSlice(ReportSection):
    name = "matched_slice"
    order = 40

    def applies(self, ctx: ReportContext) -> bool:
        return bool(ctx.test) and ctx.options.slice_ids is not None

    def build(self, ctx: ReportContext) -> list[Section]:
        o = ctx.options
        return [matched_slice_section(ctx.primary, ctx.pairs, set(o.slice_ids or ()), n_resamples=o.n_resamples,
                                      seed=o.seed, table=ctx.table)]
