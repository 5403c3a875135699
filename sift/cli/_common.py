"""Shared CLI plumbing: where the configs live, and one-line errors with nothing half-written."""

from __future__ import annotations

import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sift.errors import SiftError

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")


@contextmanager
def clean_failure(prog: str, out_dir: str | Path | None) -> Iterator[None]:
    """Turn a SiftError into one stderr line and exit 2; remove ``out_dir`` if this run left it empty."""
    existed = out_dir is not None and Path(out_dir).exists() and any(Path(out_dir).iterdir())
    try:
        yield
    except SiftError as e:
        if out_dir is not None and not existed and Path(out_dir).exists():
            shutil.rmtree(out_dir, ignore_errors=True)
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(2)
