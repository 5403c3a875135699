"""The companion families: analyses (:mod:`sift.report.analysis`) of one :class:`CompanionContext`, run in
``order`` by :func:`sift.companion.report.companion_sections` when their config node (``companion.<name>``) is
enabled.

A family is one function ``build(cfg, sources, out) -> Section`` (the ``companion`` node, the job's organism or
real-LM sources, the output folder) registered with :func:`register_family`; a new family adds its function
and its node (a field of :class:`sift.config.CompanionConfig` for the command line's schema)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sift.report import Section
from sift.report.analysis import Analysis, Registry

Build = Callable[[Any, Any, Path], Section]


@dataclass(frozen=True)
class CompanionContext:
    """What the families read (:class:`sift.report.analysis.Context`): the ``companion`` config node, the job's
    sources (their models loaded once and shared by every family) and the output folder. A family's need is its
    config node, enabled."""

    cfg: Any
    sources: Any
    out: Path

    def has(self, need: str) -> bool:
        node = self.cfg.get(need)
        return node is not None and bool(node.get("enabled", False))


@dataclass(frozen=True)
class CompanionFamily(Analysis):
    """One registered family: its config node's name, its place in the report and its section builder."""

    name: str
    function: Build
    order: float = 100.0

    @property
    def needs(self) -> tuple[str, ...]:  # type: ignore[override]
        return (self.name,)

    def build(self, ctx: CompanionContext) -> list[Section]:
        return [self.function(ctx.cfg, ctx.sources, ctx.out)]


#: the families by name (the built-in ones register when :mod:`sift.companion.report` is imported)
FAMILIES: Registry[CompanionFamily] = Registry("companion family", ("sift.companion.report",))


def register_family(name: str, order: int) -> Callable[[Build], Build]:
    """Register ``build`` as the family ``name`` (sections sorted by ``order``, then registration)."""

    def deco(build: Build) -> Build:
        FAMILIES.register(CompanionFamily(name, build, int(order)))
        return build

    return deco


def families() -> list[CompanionFamily]:
    """Every registered family, in report order."""
    return FAMILIES.ordered()
