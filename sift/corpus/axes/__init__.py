"""The FaithShift axes, one class each, in a registry by name.

An axis says its ``kind`` (``base``, ``preserving`` or ``altering``, with the ``direction`` (φ* before, φ*
after) of an altering one), how it renders the shifted view from the base view (:meth:`Axis.organism_view`
on the organism, :meth:`Axis.lm_view` on a real LM; an axis without one does not apply to that source) and how
its pairs verify (:meth:`Axis.verify`). The corpus build, the pairs, the manifest, the audit, the DataModule's
environments and the evaluation's axis lists all iterate :data:`AXES`, in registration order.

Adding an axis: a module in this package holding one :class:`PreservingAxis` or :class:`AlteringAxis`
subclass decorated with :func:`register_axis` (every module here is imported with the package), and its name
in the corpus config's ``conditions``.
"""

from __future__ import annotations

import importlib
import pkgutil
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from sift.errors import SiftError

if TYPE_CHECKING:
    from sift.lm.items import LMItem
    from sift.lm.prompts import LMView
    from sift.organism.domains import Item
    from sift.organism.render import View


class Axis:
    """One FaithShift axis (a condition of the corpus)."""

    name: ClassVar[str]
    kind: ClassVar[str]  # "base" | "preserving" | "altering"
    direction: ClassVar[tuple[int, int] | None] = None  # (φ* before, φ* after) of an altering axis
    #: the shifted trace is generated from the view this axis renders (False: the source builds it otherwise,
    #: e.g. model_family pairs two models' base traces, causal_truncation cuts the base trace)
    generated: ClassVar[bool] = True

    def organism_view(self, item: Item, base: View, rng: random.Random, phi: int | None) -> View | None:
        """The organism's view of this axis for ``item`` (``phi``: the base trace's intended label, known for
        altering axes), or None where the axis does not apply to this base."""
        return None

    def lm_view(self, item: LMItem, base: LMView, rng: random.Random,
                cue_formats: Sequence[str] | None = None) -> LMView | None:
        """A real LM's view of this axis (None: not applicable to this base); ``cue_formats``: the ordinary cue
        formats the corpus draws from (None: all; an axis that draws no cue may leave the argument out)."""
        return None

    @classmethod
    def applies_to_lm(cls) -> bool:
        """Whether the axis renders a view on a real LM at all."""
        return cls.lm_view is not Axis.lm_view

    def verify(self, phi_source: int | None, phi_shifted: int | None) -> tuple[bool, str]:
        """Whether a (source, shifted) pair of this axis is verified, and why (or why not)."""
        if phi_source is None or phi_shifted is None:
            return False, f"{'source' if phi_source is None else 'shifted'} trace ambiguous"
        return self._verify(phi_source, phi_shifted)

    def _verify(self, a: int, b: int) -> tuple[bool, str]:
        raise SiftError(f"axis {self.name!r} ({self.kind}) has no pairs to verify")


class PreservingAxis(Axis):
    """A shift that must keep φ*: its pairs verify when both labels agree."""

    kind = "preserving"

    def _verify(self, a: int, b: int) -> tuple[bool, str]:
        return a == b, "kept" if a == b else "label flipped"


class AlteringAxis(Axis):
    """A shift that flips φ* in a declared ``direction``; it applies only to bases whose label is the source
    label of the direction."""

    kind = "altering"

    def _verify(self, a: int, b: int) -> tuple[bool, str]:
        want = self.direction
        ok = (a, b) == want
        return ok, "kept" if ok else ("source label not the axis's source" if a != want[0] else "label did not flip")


#: every registered axis by name, in registration order
AXES: dict[str, Axis] = {}


def register_axis(cls: type[Axis]) -> type[Axis]:
    """Class decorator: register an instance of an :class:`Axis` subclass under its ``name``."""
    if cls.name in AXES and type(AXES[cls.name]) is not cls:
        raise SiftError(f"axis {cls.name!r} is registered twice")
    AXES[cls.name] = cls()
    return cls


def check_conditions(names: Any) -> list[str]:
    """``names`` as a list, each a registered axis."""
    names = list(names)
    bad = [n for n in names if n not in AXES]
    if bad:
        raise SiftError(f"unknown condition(s) {', '.join(map(repr, bad))}; expected any of {', '.join(AXES)}")
    return names


def generated_axes(kinds: tuple[str, ...] = ("base", "preserving", "altering")) -> list[str]:
    """The axes whose shifted traces are generated from their own view, of the given kinds, in order."""
    return [n for n, a in AXES.items() if a.generated and a.kind in kinds]


def _import_axis_modules() -> None:
    importlib.import_module(f"{__name__}.builtin")  # the ten FaithShift axes first, in the paper's order
    for mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        importlib.import_module(f"{__name__}.{mod}")


_import_axis_modules()
