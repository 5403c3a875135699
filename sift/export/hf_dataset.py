"""The corpus and the runs' predictions as Hugging Face ``datasets`` (``pip install ".[export]"``): each saved with
``save_to_disk`` (``datasets.load_from_disk``) and as one Parquet file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sift.errors import SiftError
from sift.export.rows import PREDICTION_COLUMNS, TRACE_COLUMNS, Source, prediction_rows, trace_rows


def _datasets():
    try:
        import datasets
    except ImportError as e:
        raise SiftError("the Hugging Face export needs the datasets package: pip install \"sift[export]\" "
                        "(or pip install datasets)") from e
    return datasets


def _features(columns: tuple[str, ...], rows: list[dict[str, Any]]):
    """Explicit column types: a column of nulls (φ* of an organism's ambiguous traces, a split without a job)
    keeps its type, and every export of one source has the same schema."""
    ds = _datasets()
    types = {"seed": "int64", "phi": "int64", "cot_necessary": "int64", "intended_phi": "int64", "label": "int64",
             "verdict": "int64", "prob": "float64", "threshold": "float64", "correct": "bool",
             "matched_slice": "bool"}
    return ds.Features({c: ds.Value(types.get(c, "string")) for c in columns})


def write_dataset(rows: list[dict[str, Any]], columns: tuple[str, ...], out: Path) -> dict[str, Any]:
    """``out/`` (save_to_disk) and ``out.parquet``; the row count and both names (relative to the export folder)."""
    ds = _datasets()
    table = ds.Dataset.from_list([{c: r.get(c) for c in columns} for r in rows], features=_features(columns, rows))
    table.save_to_disk(str(out))
    table.to_parquet(str(out.with_suffix(".parquet")))
    return {"rows": len(table), "dataset": out.name, "parquet": out.with_suffix(".parquet").name}


def export_hf(src: Source, out_dir: Path) -> dict[str, Any]:
    """``<out_dir>/corpus`` (one row per trace) and, for a job with runs, ``<out_dir>/predictions`` (one row per
    run, split and trace)."""
    got = {"corpus": write_dataset(trace_rows(src), TRACE_COLUMNS, out_dir / "corpus")}
    preds = list(prediction_rows(src))
    if preds:
        got["predictions"] = write_dataset(preds, PREDICTION_COLUMNS, out_dir / "predictions")
    return got


__all__ = ["export_hf", "write_dataset"]
