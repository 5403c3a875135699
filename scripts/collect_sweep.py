#!/usr/bin/env python
"""Collect a sweep folder's results.json files into one table (no W&B needed).

    python scripts/collect_sweep.py outputs/sweeps/<date>                 # markdown, one row per run
    python scripts/collect_sweep.py outputs/sweeps/<date> --aggregate     # mean ± sd over seeds
    python scripts/collect_sweep.py outputs/sweeps/<date> --format csv --out table.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sift.results import DEFAULT_METRICS, aggregate, load_records, rows, to_csv, to_markdown


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", help="sweep folder (searched recursively for results.json)")
    ap.add_argument("--format", choices=("md", "csv"), default="md")
    ap.add_argument("--metrics", nargs="+", default=list(DEFAULT_METRICS))
    ap.add_argument("--aggregate", action="store_true", help="mean ± sd over seeds per config")
    ap.add_argument("--members", action="store_true", help="include ensemble members")
    ap.add_argument("--out", help="also write the table to this file")
    a = ap.parse_args(argv)
    if not Path(a.root).is_dir():
        print(f"collect_sweep: error: {a.root} is not a folder", file=sys.stderr)
        return 2
    table = rows(load_records(a.root, include_members=a.members), a.metrics)
    if a.aggregate:
        table = aggregate(table, a.metrics)
    text = to_markdown(table) if a.format == "md" else to_csv(table)
    print(text, end="")
    if a.out:
        Path(a.out).write_text(text)
    return 0 if table else 1


if __name__ == "__main__":
    sys.exit(main())
