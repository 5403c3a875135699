"""Pairs of the corpus: every condition trace with its base trace, verified against its axis's label rule."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sift.corpus.axes import AXES


def mechanism_of(record: Mapping) -> int | None:
    """The mechanism latent a trace ran with (organism twins), or None for a trace without one (a real LM's)."""
    lat = record.get("latent")
    return int(lat["mechanism"]) if lat else None


def build_pairs(records: list[dict], families: Sequence[str], conditions: Sequence[str]) -> list[dict]:
    """Pair every condition trace with its base trace of the same mechanism (model family: base of one family vs
    the other's, under the same mechanism)."""
    by_key = {(r["family"], r["base_item"], r["condition"], mechanism_of(r)): r for r in records}
    pairs = []
    units = sorted({(r["base_item"], mechanism_of(r)) for r in records},
                   key=lambda k: (k[0], -1 if k[1] is None else k[1]))
    for item, m in units:
        for fam in families:
            base = by_key.get((fam, item, "base", m))
            if base is None:
                continue
            for cond in conditions:
                if cond in ("base", "model_family"):
                    continue
                other = by_key.get((fam, item, cond, m))
                if other is not None:
                    pairs.append(pair_record(base, other, cond))
        if "model_family" in conditions and len(families) >= 2:
            a = by_key.get((families[0], item, "base", m))
            b = by_key.get((families[1], item, "base", m))
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
