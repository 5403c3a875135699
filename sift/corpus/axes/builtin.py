"""The ten FaithShift axes (base, six preserving, three altering) and how each is realised."""

from __future__ import annotations

import random
from collections.abc import Sequence

from sift.corpus.axes import AlteringAxis, Axis, PreservingAxis, register_axis
from sift.lm.items import LMItem
from sift.lm.prompts import TEMPLATES, LMView, cue_formats_for
from sift.lm.views import relabel, reorder
from sift.organism.domains import Item
from sift.organism.render import CUE_FORMATS, DECISIVE_FORMAT, View


@register_axis
class Base(Axis):
    """The base trace every pair starts from."""

    name = "base"
    kind = "base"

    def organism_view(self, item: Item, base: View, rng: random.Random, phi: int | None) -> View | None:
        return base

    def lm_view(self, item: LMItem, base: LMView, rng: random.Random) -> LMView | None:
        return base


@register_axis
class Paraphrase(PreservingAxis):
    """Another question wrapper around the same question."""

    name = "paraphrase"

    def organism_view(self, item: Item, base: View, rng: random.Random, phi: int | None) -> View | None:
        return base.with_(template=1 - base.template)

    def lm_view(self, item: LMItem, base: LMView, rng: random.Random) -> LMView | None:
        return base.with_(template=rng.choice([t for t in range(len(TEMPLATES)) if t != base.template]))


def reordered(item: Item) -> tuple[int, ...] | None:
    """A non-identity order of the independent facts, or None if the item has none."""
    if item.domain == "arithmetic":
        return tuple(reversed(range(item.n_ops)))
    if item.domain == "choice":
        return (1, 2, 3, 0)
    if item.facts[0] == item.facts[1]:
        return None
    return (1, 0)


@register_axis
class StepReordering(PreservingAxis):
    """The independent facts in another order: on a real LM the options of a multiple-choice item (relabelled), the
    independent premises of a word problem, or the additive terms of an expression (sift.lm.views)."""

    name = "step_reordering"

    def organism_view(self, item: Item, base: View, rng: random.Random, phi: int | None) -> View | None:
        order = reordered(item)
        return None if order is None else base.with_(order=order)

    def lm_view(self, item: LMItem, base: LMView, rng: random.Random) -> LMView | None:
        found = reorder(item, rng)
        if found is None:
            return None
        unit, order = found
        cue = relabel(item, order, base.cue_value) if unit == "options" else base.cue_value
        return base.with_(order=order, order_unit=unit, cue_value=cue)


@register_axis
class HintFormat(PreservingAxis):
    """The base cue in another format (bases that carry a cue)."""

    name = "hint_format"

    def organism_view(self, item: Item, base: View, rng: random.Random, phi: int | None) -> View | None:
        if base.cue_value is None:
            return None
        return base.with_(cue_format=rng.choice([f for f in CUE_FORMATS if f != base.cue_format]))

    def lm_view(self, item: LMItem, base: LMView, rng: random.Random,
                cue_formats: Sequence[str] | None = None) -> LMView | None:
        others = [f for f in cue_formats_for(item.answer_kind, cue_formats) if f != base.cue_format]
        if base.cue_value is None or not others:
            return None
        return base.with_(cue_format=rng.choice(others))


@register_axis
class Language(PreservingAxis):
    """The other lexicon of the organism; on a real LM the item's human translation (same gold answer)."""

    name = "language"

    def organism_view(self, item: Item, base: View, rng: random.Random, phi: int | None) -> View | None:
        return base.with_(language="xx" if base.language == "en" else "en")

    def lm_view(self, item: LMItem, base: LMView, rng: random.Random) -> LMView | None:
        if not item.translations:
            return None
        return base.with_(language=rng.choice([lang for lang, _ in item.translations]))


@register_axis
class Budget(PreservingAxis):
    """Terse ↔ verbose."""

    name = "budget"

    def organism_view(self, item: Item, base: View, rng: random.Random, phi: int | None) -> View | None:
        return base.with_(budget="verbose" if base.budget == "terse" else "terse")

    def lm_view(self, item: LMItem, base: LMView, rng: random.Random) -> LMView | None:
        return base.with_(budget="verbose" if base.budget == "terse" else "terse")


@register_axis
class ModelFamily(PreservingAxis):
    """The other model on the same item and view: the sources pair the two models' base traces."""

    name = "model_family"
    generated = False

    def organism_view(self, item: Item, base: View, rng: random.Random, phi: int | None) -> View | None:
        return base


@register_axis
class CueInjection(AlteringAxis):
    """A decisive cue toward a wrong answer, on bases whose label is faithful."""

    name = "cue_injection"
    direction = (1, 0)

    def organism_view(self, item: Item, base: View, rng: random.Random, phi: int | None) -> View | None:
        if phi != 1:
            return None
        value = rng.choice([v for v in item.answer_space if v != item.answer])
        return base.with_(cue_value=value, cue_format=DECISIVE_FORMAT)


@register_axis
class CueVerbalization(AlteringAxis):
    """The instruction to say so when a hint is used, on cued bases whose label is unfaithful (an uncued base's
    φ*=0 comes from a CoT that is not read: there is no cue to state)."""

    name = "cue_verbalization"
    direction = (0, 1)

    def organism_view(self, item: Item, base: View, rng: random.Random, phi: int | None) -> View | None:
        return base.with_(explain=True) if phi == 0 and base.cue_value is not None else None


@register_axis
class CausalTruncation(AlteringAxis):
    """The base CoT cut before its decisive step and the answer forced (Lanham et al.): the sources cut it."""

    name = "causal_truncation"
    direction = (1, 0)
    generated = False

    def organism_view(self, item: Item, base: View, rng: random.Random, phi: int | None) -> View | None:
        return base if phi == 1 else None
