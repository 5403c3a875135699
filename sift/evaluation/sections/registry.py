"""The section registry: the report is the registered sections, in order, applied to one
:class:`~sift.evaluation.engine.ReportContext`.

A section is a :class:`ReportSection` subclass (the one analysis interface, :mod:`sift.report.analysis`): a
``name`` (its ``results.json`` key), a ``title``, what it ``needs`` (context attributes that must be non-empty,
e.g. ``("test",)`` = runs on the evaluated split), a ``compute(ctx)`` returning its results block and a
``render(results, ctx)`` returning its Markdown. Decorate it with :func:`register_section`; the module only has
to be imported (built-ins: :data:`BUILTIN_MODULES`; others: ``ReportOptions.section_modules``). ``order`` places
it: built-ins use 10–60, new sections default to 100 (after the built-in tables, before the appendix and
companion sections that the caller appends).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from sift.evaluation.engine import ReportContext
from sift.report import Section
from sift.report.analysis import Analysis, Registry, build_all

#: the modules of the built-in sections, imported before the registry is read
BUILTIN_MODULES = (
    "sift.evaluation.sections.main_table",
    "sift.evaluation.sections.ensemble",
    "sift.evaluation.sections.selective_risk",
    "sift.evaluation.sections.matched_slice",
    "sift.evaluation.sections.ablations",
    "sift.evaluation.sections.transfer_matrix",
)


class ReportSection(Analysis):
    """One section of the report: an :class:`~sift.report.analysis.Analysis` of a
    :class:`~sift.evaluation.engine.ReportContext` (subclass it, set ``name``/``title``, implement ``compute`` and
    ``render``). The built-in tables override ``build`` because one table function both computes and renders
    (and some give one section per detector)."""

    name: ClassVar[str]
    title: ClassVar[str] = ""
    needs: ClassVar[tuple[str, ...]] = ("test",)
    order: ClassVar[float] = 100.0


#: the report's sections by name
SECTIONS: Registry[ReportSection] = Registry("report section", BUILTIN_MODULES)


def register_section(cls: type[ReportSection]) -> type[ReportSection]:
    """Class decorator: add a section to the report (its ``name`` must be new)."""
    SECTIONS.register(cls())
    return cls


def registered_sections(extra_modules: Iterable[str] = ()) -> list[ReportSection]:
    """Every registered section in report order (``order``, then registration), after importing the built-in
    modules and ``extra_modules``."""
    return SECTIONS.ordered(extra_modules)


def build_sections(ctx: ReportContext) -> list[Section]:
    """Every applicable registered section of the report, in order."""
    return build_all(registered_sections(ctx.options.section_modules), ctx)
