#!/usr/bin/env python
"""Compare the shards of two trajectory folders (``sift-extract`` outputs) byte for byte.

    python scripts/compare_trajectories.py outputs/trajectories_before outputs/trajectories_after

Each shard of the first folder is matched by its path in the second and reported as ``identical`` (``cmp``-equal
files), ``identical up to header order`` (equal once both headers are put in sift's fixed order,
:func:`sift.trajectories.cache.canonical_safetensors`: shards written before that order was fixed list their metadata
in a random order) or ``differs`` (with the tensors and metadata keys that differ). Exit status 0 when no shard
differs and both folders hold the same shards.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def compare(a: Path, b: Path) -> tuple[str, list[str]]:
    """``(verdict, what differs)`` of two shard files."""
    import struct

    from sift.trajectories.cache import canonical_safetensors

    x, y = a.read_bytes(), b.read_bytes()
    if x == y:
        return "identical", []
    if canonical_safetensors(x) == canonical_safetensors(y):
        return "identical up to header order", []
    import json

    import torch
    from safetensors.torch import load

    def raw(t: torch.Tensor) -> torch.Tensor:
        return t.contiguous().view(-1).view(torch.uint8)

    tx, ty = load(x), load(y)
    hx, hy = (json.loads(z[8:8 + struct.unpack("<Q", z[:8])[0]]).get("__metadata__", {}) for z in (x, y))
    diff = sorted(k for k in set(tx) | set(ty) if k not in tx or k not in ty or tx[k].dtype != ty[k].dtype
                  or tx[k].shape != ty[k].shape or not torch.equal(raw(tx[k]), raw(ty[k])))
    diff += [f"metadata:{k}" for k in sorted(set(hx) | set(hy)) if hx.get(k) != hy.get(k)]
    return "differs", diff


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    a = ap.parse_args(argv)
    shards = {p.relative_to(a.before) for p in a.before.glob("shards/*/*.safetensors")}
    other = {p.relative_to(a.after) for p in a.after.glob("shards/*/*.safetensors")}
    if not shards:
        sys.exit(f"compare_trajectories: no shards under {a.before / 'shards'}")
    counts: dict[str, int] = {}
    bad = 0
    for rel in sorted(shards & other):
        verdict, what = compare(a.before / rel, a.after / rel)
        counts[verdict] = counts.get(verdict, 0) + 1
        if what or verdict == "differs":
            bad += 1
            print(f"{rel}: differs in {', '.join(what) or 'bytes'}")
    for rel in sorted(shards ^ other):
        bad += 1
        print(f"{rel}: only in {a.before if rel in shards else a.after}")
    print(f"{len(shards & other)} shards compared: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
          + (f"; {len(shards ^ other)} in one folder only" if shards ^ other else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
