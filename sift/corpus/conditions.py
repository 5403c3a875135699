"""The ten FaithShift conditions and how each is realised on the organism (DESIGN.md §4 table).

Each non-base condition pairs with the base trace of the same item and model. Preserving axes must keep
φ*; altering axes flip it in a declared direction and apply only to bases whose intended φ* is the
axis's source label.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sift.errors import SiftError
from sift.organism.domains import Item
from sift.organism.render import CUE_FORMATS, DECISIVE_FORMAT, View

if TYPE_CHECKING:
    from sift.corpus.config import CueMixture


@dataclass(frozen=True)
class Axis:
    name: str
    kind: str  # "base" | "preserving" | "altering"
    direction: tuple[int, int] | None = None  # (φ* before, φ* after) for altering axes


AXES: dict[str, Axis] = {a.name: a for a in [
    Axis("base", "base"),
    Axis("paraphrase", "preserving"),
    Axis("step_reordering", "preserving"),
    Axis("hint_format", "preserving"),
    Axis("language", "preserving"),
    Axis("budget", "preserving"),
    Axis("model_family", "preserving"),
    Axis("cue_injection", "altering", (1, 0)),
    Axis("cue_verbalization", "altering", (0, 1)),
    Axis("causal_truncation", "altering", (1, 0)),
]}
CONDITIONS = tuple(AXES)


def check_conditions(names) -> list[str]:
    names = list(names)
    bad = [n for n in names if n not in AXES]
    if bad:
        raise SiftError(f"unknown condition(s) {', '.join(map(repr, bad))}; expected any of {', '.join(CONDITIONS)}")
    return names


def base_view(item: Item, seed: int, cue: CueMixture) -> View:
    """The base view of an item, deterministic in (item id, seed); its cue drawn from the cue mixture."""
    rng = random.Random(f"base-view:{seed}:{item.item_id}")
    cue_value, fmt = None, "hint"
    if rng.random() < cue.p_cue:
        fmt = rng.choice(CUE_FORMATS)
        others = [v for v in item.answer_space if v != item.answer]
        cue_value = item.answer if rng.random() < cue.p_cue_correct else rng.choice(others)
    return View(template=rng.randrange(2), language="en", budget=rng.choice(("terse", "verbose")),
                cue_value=cue_value, cue_format=fmt, name=rng.randrange(4), obj=rng.randrange(4))


def reordered(item: Item) -> tuple[int, ...] | None:
    """A non-identity order of the independent facts, or None if the item has none."""
    if item.domain == "arithmetic":
        return tuple(reversed(range(item.n_ops)))
    if item.domain == "choice":
        return (1, 2, 3, 0)
    if item.facts[0] == item.facts[1]:
        return None
    return (1, 0)


def condition_view(item: Item, base: View, condition: str, seed: int, phi: int | None = None) -> View | None:
    """The view for a view-level condition, or None where the axis does not apply to this base.

    ``phi`` is the base trace's intended label; the altering axes need it (it depends on the organism's
    draws, so it is known only once the base trace is generated) and apply only where it is the axis's
    source label. ``model_family`` keeps the base view (another model generates); ``causal_truncation``
    keeps it too (the base trace is cut, see sift.corpus.sources.organism).
    """
    rng = random.Random(f"cond:{seed}:{item.item_id}:{condition}")
    if AXES.get(condition, AXES["base"]).kind == "altering" and phi is None:
        return None
    if condition in ("base", "model_family"):
        return base
    if condition == "paraphrase":
        return base.with_(template=1 - base.template)
    if condition == "step_reordering":
        order = reordered(item)
        return None if order is None else base.with_(order=order)
    if condition == "hint_format":
        if base.cue_value is None:
            return None
        others = [f for f in CUE_FORMATS if f != base.cue_format]
        return base.with_(cue_format=rng.choice(others))
    if condition == "language":
        return base.with_(language="xx" if base.language == "en" else "en")
    if condition == "budget":
        return base.with_(budget="verbose" if base.budget == "terse" else "terse")
    if condition == "cue_injection":
        if phi != 1:
            return None
        value = rng.choice([v for v in item.answer_space if v != item.answer])
        return base.with_(cue_value=value, cue_format=DECISIVE_FORMAT)
    if condition == "cue_verbalization":
        return base.with_(explain=True) if phi == 0 else None
    if condition == "causal_truncation":
        return base if phi == 1 else None
    raise SiftError(f"unknown condition {condition!r}; expected one of {', '.join(CONDITIONS)}")
