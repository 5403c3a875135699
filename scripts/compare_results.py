"""Compare two ``results.json`` files: every number to a tolerance, every other value exactly.

    python scripts/compare_results.py BEFORE/report/results.json AFTER/report/results.json [--tol 1e-9]

Keys that legitimately differ between two code versions (``--ignore``, default: config hashes, the
package version and wall-clock timings) are skipped. Exit status 0 when nothing else differs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

DEFAULT_IGNORE = ("config_hash", "sift_version", "wall_s", "seconds", "elapsed_s", "duration_s")


def differences(a: Any, b: Any, tol: float, ignore: tuple[str, ...], path: str = "") -> list[str]:
    """Paths where ``a`` and ``b`` differ (numbers beyond ``tol``, anything else when unequal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}/{k}: only in {'before' if k in a else 'after'}" for k in sorted(set(a) ^ set(b))
               if k not in ignore]
        for k in sorted(set(a) & set(b)):
            if k not in ignore:
                out += differences(a[k], b[k], tol, ignore, f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, tol, ignore, f"{path}[{i}]")]
    number = (int, float)
    if isinstance(a, number) and isinstance(b, number) and not isinstance(a, bool) and not isinstance(b, bool):
        if (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tol:
            return []
        return [f"{path}: {a!r} vs {b!r} (|Δ| = {abs(a - b):.3g})"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--tol", type=float, default=1e-9, help="largest allowed |difference| of a number")
    ap.add_argument("--ignore", nargs="*", default=list(DEFAULT_IGNORE), help="keys skipped at any depth")
    args = ap.parse_args(argv)
    before, after = (json.loads(p.read_text()) for p in (args.before, args.after))
    diffs = differences(before, after, args.tol, tuple(args.ignore))
    for d in diffs[:200]:
        print(d)
    print(f"{len(diffs)} difference(s) beyond {args.tol:g} (ignoring {', '.join(args.ignore)})")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
