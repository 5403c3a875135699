"""Collect ``results.json`` files of a sweep folder into one table (markdown / CSV), without W&B."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

DEFAULT_METRICS = ("val/auroc", "test/auroc", "test/balanced_acc", "transfer/auroc", "val/threshold")
ID_COLUMNS = ("detector", "data", "kind", "seed", "config_hash", "run")


def load_records(root: str | Path, include_members: bool = False) -> list[dict[str, Any]]:
    """Every ``results.json`` under ``root`` (recursive), sorted by folder; ensemble members are skipped
    unless ``include_members``. Unreadable files are reported as records with ``status='unreadable'``."""
    root = Path(root)
    recs = []
    for p in sorted(root.rglob("results.json")):
        try:
            r = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as e:
            r = {"status": "unreadable", "error": str(e)}
        if r.get("kind") == "member" and not include_members:
            continue
        r["run"] = str(p.parent.relative_to(root)) or "."
        recs.append(r)
    return recs


def rows(records: Iterable[dict[str, Any]], metrics: Sequence[str] = DEFAULT_METRICS) -> list[dict[str, Any]]:
    """One flat row per record: id columns, then the requested metrics (None if absent)."""
    out = []
    for r in records:
        row = {k: r.get(k) for k in ID_COLUMNS}
        m = r.get("metrics", {})
        row.update({k: m.get(k) for k in metrics})
        out.append(row)
    return out


def aggregate(table: Sequence[dict[str, Any]], metrics: Sequence[str] = DEFAULT_METRICS) -> list[dict[str, Any]]:
    """Mean ± sample sd over seeds, per (detector, data, kind, config_hash)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in table:
        groups.setdefault((r["detector"], r["data"], r["kind"], r["config_hash"]), []).append(r)
    out = []
    for (det, data, kind, ch), rs in groups.items():
        row: dict[str, Any] = {"detector": det, "data": data, "kind": kind, "config_hash": ch, "n_seeds": len(rs),
                               "seeds": ",".join(str(r["seed"]) for r in rs)}
        for k in metrics:
            v = [r[k] for r in rs if isinstance(r.get(k), (int, float))]
            if not v:
                row[k] = None
                continue
            mu = sum(v) / len(v)
            sd = math.sqrt(sum((x - mu) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else 0.0
            row[k] = f"{mu:.3f} ± {sd:.3f}"
        out.append(row)
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def to_markdown(table: Sequence[dict[str, Any]]) -> str:
    if not table:
        return "(no results)\n"
    cols = list(table[0].keys())
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in table]
    return "\n".join(lines) + "\n"


def to_csv(table: Sequence[dict[str, Any]]) -> str:
    if not table:
        return ""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(table[0].keys()))
    w.writeheader()
    for r in table:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue()
