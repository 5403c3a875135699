"""The companion families: a registry of report-section builders, run in ``order`` by
:func:`sift.companion.report.companion_sections` when their config node (``companion.<name>``) is enabled.

A family is one function ``build(cfg, sources, out) -> Section`` (the ``companion`` node, the job's organism or
real-LM sources, the output folder) registered with :func:`register_family`; a new family adds its function
and its node (a field of :class:`sift.config.CompanionConfig` for the command line's schema)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sift.errors import SiftError
from sift.report import Section

Build = Callable[[Any, Any, Path], Section]


@dataclass(frozen=True)
class CompanionFamily:
    """One registered family: its config node's name, its place in the report and its section builder."""

    name: str
    order: int
    build: Build


#: name → family (the built-in ones register when :mod:`sift.companion.report` is imported)
REGISTRY: dict[str, CompanionFamily] = {}


def register_family(name: str, order: int) -> Callable[[Build], Build]:
    """Register ``build`` as the family ``name`` (sections sorted by ``order``, then name)."""

    def deco(build: Build) -> Build:
        old = REGISTRY.get(name)
        if old is not None and old.build.__qualname__ != build.__qualname__:
            raise SiftError(f"companion family {name!r} is registered twice ({old.build.__qualname__}, "
                            f"{build.__qualname__})")
        REGISTRY[name] = CompanionFamily(name, int(order), build)
        return build

    return deco


def families() -> list[CompanionFamily]:
    """Every registered family, in report order."""
    import sift.companion.report  # noqa: F401  (registers the built-in families)

    return sorted(REGISTRY.values(), key=lambda f: (f.order, f.name))
