"""Pairs of the corpus: every condition trace with its base trace, verified against its axis's label rule."""

from __future__ import annotations

from collections.abc import Sequence

from sift.corpus.axes import AXES


def build_pairs(records: list[dict], families: Sequence[str], conditions: Sequence[str]) -> list[dict]:
    """Pair every condition trace with its base trace (model family: base of one family vs the other's)."""
    by_key = {(r["family"], r["base_item"], r["condition"]): r for r in records}
    pairs = []
    items = sorted({r["base_item"] for r in records})
    for item in items:
        for fam in families:
            base = by_key.get((fam, item, "base"))
            if base is None:
                continue
            for cond in conditions:
                if cond in ("base", "model_family"):
                    continue
                other = by_key.get((fam, item, cond))
                if other is not None:
                    pairs.append(pair_record(base, other, cond))
        if "model_family" in conditions and len(families) >= 2:
            a = by_key.get((families[0], item, "base"))
            b = by_key.get((families[1], item, "base"))
            if a is not None and b is not None:
                pairs.append(pair_record(a, b, "model_family"))
    return pairs


def pair_record(src: dict, dst: dict, axis: str) -> dict:
    """The pair of a source and a shifted trace on ``axis``: verified when the labels do what the axis says."""
    ax = AXES[axis]
    a, b = src["phi"], dst["phi"]
    verified, why = ax.verify(a, b)
    return {"axis": axis, "kind": ax.kind, "base_item": src["base_item"], "source": src["trace_id"],
            "shifted": dst["trace_id"], "phi_source": a, "phi_shifted": b, "verified": verified, "reason": why}
