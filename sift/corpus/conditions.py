"""The organism's views: the base view of an item (its cue drawn from the cue mixture) and the view of a
condition, rendered by that condition's axis (:mod:`sift.corpus.axes`).

Each non-base condition pairs with the base trace of the same item and model. Preserving axes must keep
φ*; altering axes flip it in a declared direction and apply only to bases whose intended φ* is the
axis's source label.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from sift.corpus.axes import AXES
from sift.errors import SiftError
from sift.organism.domains import Item
from sift.organism.render import CUE_FORMATS, View

if TYPE_CHECKING:
    from sift.corpus.config import CueMixture


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


def condition_view(item: Item, base: View, condition: str, seed: int, phi: int | None = None) -> View | None:
    """The view for a view-level condition, or None where the axis does not apply to this base.

    ``phi`` is the base trace's intended label; the altering axes need it (it depends on the organism's
    draws, so it is known only once the base trace is generated) and apply only where it is the axis's
    source label. ``model_family`` keeps the base view (another model generates); ``causal_truncation``
    keeps it too (the base trace is cut, see sift.corpus.sources.organism).
    """
    axis = AXES.get(condition)
    if axis is None:
        raise SiftError(f"unknown condition {condition!r}; expected one of {', '.join(AXES)}")
    rng = random.Random(f"cond:{seed}:{item.item_id}:{condition}")
    if axis.kind == "altering" and phi is None:
        return None
    return axis.organism_view(item, base, rng, phi)
