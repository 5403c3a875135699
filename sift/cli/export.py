"""``sift-export``: a job's corpus and predictions as Hugging Face datasets and an Inspect AI eval log
(:func:`sift.export.export`; docs/exports.md).

    sift-export outputs/faithshift                       # into outputs/faithshift/export
    sift-export outputs/corpus --out exports/corpus --formats hf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sift.errors import SiftError


def main(argv: list[str] | None = None) -> int:
    from sift.export import FORMATS, export

    ap = argparse.ArgumentParser(prog="sift-export", description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, help="a sift-faithshift output folder, or a corpus folder")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default: <source>/export)")
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    args = ap.parse_args(argv)
    try:
        got = export(args.source, args.out or args.source / "export", args.formats)
    except SiftError as e:
        print(f"sift-export: error: {e}", file=sys.stderr)
        return 2
    out = args.out or args.source / "export"
    for name, info in (got.get("hf") or {}).items():
        print(f"sift-export: {name}: {info['rows']} rows -> {out / info['dataset']} (datasets.load_from_disk), "
              f"{out / info['parquet']}")
    if "inspect" in got:
        print(f"sift-export: eval log: {got['inspect']['samples']} samples -> {out / got['inspect']['log']} "
              f"(inspect view --log-dir {out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
