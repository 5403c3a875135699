"""The section registry: the report is the registered sections, in order, applied to one
:class:`~sift.evaluation.engine.ReportContext`.

A section is a :class:`ReportSection` subclass: a ``name`` (its ``results.json`` key), a ``title``, what it
``needs`` (context attributes that must be non-empty, e.g. ``("test",)`` = runs on the evaluated split), a
``compute(ctx)`` returning its results block and a ``render(results, ctx)`` returning its Markdown. Decorate it
with :func:`register_section`; the module only has to be imported (built-ins: :data:`BUILTIN_MODULES`; others:
``ReportOptions.section_modules``). ``order`` places it: built-ins use 10–60, new sections default to 100 (after
the built-in tables, before the appendix and companion sections that the caller appends).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any, ClassVar

from sift.errors import SiftError
from sift.evaluation.engine import ReportContext
from sift.report import Section

#: the modules of the built-in sections, imported before the registry is read
BUILTIN_MODULES = (
    "sift.evaluation.sections.main_table",
    "sift.evaluation.sections.ensemble",
    "sift.evaluation.sections.selective_risk",
    "sift.evaluation.sections.matched_slice",
    "sift.evaluation.sections.ablations",
    "sift.evaluation.sections.transfer_matrix",
)


class ReportSection:
    """One section of the report (subclass it, set ``name``/``title``, implement ``compute`` and ``render``).

    ``build`` turns the context into :class:`~sift.report.Section` objects; the built-in tables override it
    because one table function both computes and renders (and some give one section per detector).
    """

    name: ClassVar[str]
    title: ClassVar[str] = ""
    needs: ClassVar[tuple[str, ...]] = ("test",)
    order: ClassVar[float] = 100.0

    def applies(self, ctx: ReportContext) -> bool:
        """Whether the context has what the section needs (every attribute of ``needs`` non-empty)."""
        return all(bool(getattr(ctx, n)) for n in self.needs)

    def compute(self, ctx: ReportContext) -> dict[str, Any]:
        """The section's ``results.json`` block (JSON-able numbers; NaN as None)."""
        raise NotImplementedError(f"section {self.name!r} defines neither compute() nor build()")

    def render(self, results: dict[str, Any], ctx: ReportContext) -> str:
        """The section's Markdown from its results block."""
        raise NotImplementedError(f"section {self.name!r} defines neither render() nor build()")

    def build(self, ctx: ReportContext) -> list[Section]:
        results = self.compute(ctx)
        return [Section(self.name, self.title or self.name, self.render(results, ctx), results=results)]


#: section name → section class, in registration order
REGISTRY: dict[str, type[ReportSection]] = {}


def register_section(cls: type[ReportSection]) -> type[ReportSection]:
    """Class decorator: add a section to the report (its ``name`` must be new)."""
    name = getattr(cls, "name", None)
    if not name:
        raise SiftError(f"report section {cls.__qualname__} has no name")
    if name in REGISTRY and REGISTRY[name] is not cls:
        raise SiftError(f"report section {name!r} is registered twice ({REGISTRY[name].__qualname__}, "
                        f"{cls.__qualname__})")
    REGISTRY[name] = cls
    return cls


def registered_sections(extra_modules: Iterable[str] = ()) -> list[ReportSection]:
    """Instances of every registered section in report order (``order``, then registration), after importing
    the built-in modules and ``extra_modules``."""
    for mod in (*BUILTIN_MODULES, *extra_modules):
        importlib.import_module(mod)
    index = {n: i for i, n in enumerate(REGISTRY)}
    return [REGISTRY[n]() for n in sorted(REGISTRY, key=lambda n: (REGISTRY[n].order, index[n]))]


def build_sections(ctx: ReportContext) -> list[Section]:
    """Every applicable registered section of the report, in order."""
    out: list[Section] = []
    for section in registered_sections(ctx.options.section_modules):
        if section.applies(ctx):
            out.extend(section.build(ctx))
    return out
