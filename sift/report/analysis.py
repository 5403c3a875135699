"""The one analysis interface of every report: the main tables, the appendix analyses and the companion families.

An :class:`Analysis` has a ``name`` (its ``results.json`` key), a ``title``, an ``order`` in its report, what it
``needs`` of its context (:meth:`Context.has` says whether the context holds it), a ``compute(ctx)`` returning its
results block and a ``render(results, ctx)`` returning its Markdown; ``build(ctx)`` gives its sections (an
analysis whose one function computes and renders overrides ``build``). A :class:`Registry` holds the analyses of
one report part by name; :func:`build_all` runs those that apply. The contexts are
:class:`sift.evaluation.engine.ReportContext` (the main tables), :class:`sift.evaluation.appendix.AppendixContext`
and :class:`sift.companion.families.CompanionContext`; each caches what several analyses read (the aligned
prediction table, the SGR certificate per run, the loaded source models).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from sift.errors import SiftError
from sift.report import Section


class Context(Protocol):
    """What an analysis reads: ``has(need)`` says whether the context holds one of an analysis's ``needs``."""

    def has(self, need: str) -> bool:
        ...


class Analysis:
    """One analysis of a report (subclass it, or see the appendix and companion wrappers)."""

    name: str
    title: str = ""
    order: float = 100.0
    needs: tuple[str, ...] = ()

    def applies(self, ctx: Context) -> bool:
        """Whether the context has everything the analysis needs."""
        return all(ctx.has(n) for n in self.needs)

    def compute(self, ctx: Any) -> dict[str, Any]:
        """The analysis's ``results.json`` block (JSON-able numbers; NaN as None)."""
        raise NotImplementedError(f"analysis {self.name!r} defines neither compute() nor build()")

    def render(self, results: dict[str, Any], ctx: Any) -> str:
        """The analysis's Markdown from its results block."""
        raise NotImplementedError(f"analysis {self.name!r} defines neither render() nor build()")

    def build(self, ctx: Any) -> list[Section]:
        results = self.compute(ctx)
        return [Section(self.name, self.title or self.name, self.render(results, ctx), results=results)]


A = TypeVar("A", bound=Analysis)


class Registry(Generic[A]):
    """The analyses of one report part by name, in report order (``order``, then registration); ``modules`` are
    imported (they register the built-in ones) before the registry is read."""

    def __init__(self, kind: str, modules: Iterable[str] = ()):
        self.kind, self.modules = kind, tuple(modules)
        self._entries: dict[str, A] = {}

    def register(self, analysis: A) -> A:
        """Add an analysis; its name must be new (the same definition imported again replaces itself)."""
        name = getattr(analysis, "name", None)
        if not name:
            raise SiftError(f"{self.kind} {type(analysis).__qualname__} has no name")
        old = self._entries.get(name)
        if old is not None and _definition(old) != _definition(analysis):
            raise SiftError(f"{self.kind} {name!r} is registered twice ({_definition(old)}, {_definition(analysis)})")
        self._entries[name] = analysis
        return analysis

    def ordered(self, extra_modules: Iterable[str] = ()) -> list[A]:
        """Every registered analysis in report order, after importing the built-in modules and ``extra_modules``."""
        for mod in (*self.modules, *extra_modules):
            importlib.import_module(mod)
        return list(self)

    def copy(self) -> Registry[A]:
        """A registry with the same entries (a test adds to it without touching this one)."""
        out: Registry[A] = Registry(self.kind, self.modules)
        out._entries = dict(self._entries)
        return out

    def __getitem__(self, name: str) -> A:
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[A]:
        """The registered analyses in report order (the built-in modules not imported: see :meth:`ordered`)."""
        index = {n: i for i, n in enumerate(self._entries)}
        return iter(sorted(self._entries.values(), key=lambda a: (a.order, index[a.name])))

    def __len__(self) -> int:
        return len(self._entries)


def _definition(analysis: Analysis) -> str:
    """What identifies an analysis's definition: its class, or the function it wraps."""
    fn = getattr(analysis, "function", None)
    return fn.__qualname__ if callable(fn) else type(analysis).__qualname__


def build_all(analyses: Iterable[Analysis], ctx: Context) -> list[Section]:
    """The sections of every analysis that applies to ``ctx``, in the given order."""
    out: list[Section] = []
    for a in analyses:
        if a.applies(ctx):
            out.extend(a.build(ctx))
    return out
