"""Exports of a corpus and a job's predictions where researchers look (docs/exports.md): Hugging Face
``datasets`` (``save_to_disk`` and Parquet) and an Inspect AI eval log. ``sift-export`` is the command,
:func:`export` the API, ``export=true`` the main job's stage.

    from sift.export import export
    export("outputs/faithshift", "outputs/faithshift/export")           # a job folder: corpus, splits, predictions
    export("outputs/corpus", "exports/corpus", formats=("hf",))         # a corpus folder: the traces alone
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sift.errors import SiftError
from sift.export.rows import Source

FORMATS = ("hf", "inspect")


def export(source: str | Path, out_dir: str | Path, formats: Sequence[str] = FORMATS) -> dict[str, Any]:
    """Write the exports of ``source`` (a sift-faithshift output folder or a corpus folder) into ``out_dir``:
    ``corpus/`` + ``corpus.parquet`` and ``predictions/`` + ``predictions.parquet`` (hf), ``<name>.eval``
    (inspect), and ``export.json`` (what was written, names relative to ``out_dir``, with row counts).
    Everything is written into a temporary folder beside ``out_dir`` and moved into place at the end: a failed
    export leaves nothing half-written."""
    from sift import __version__

    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise SiftError(f"export formats: {bad or list(formats)} not in {list(FORMATS)}")
    src = Source.of(source)
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        got: dict[str, Any] = {"source": str(Path(source)), "corpus": str(src.corpus_dir),
                               "sift_version": __version__}
        if "hf" in formats:
            from sift.export.hf_dataset import export_hf

            got["hf"] = export_hf(src, tmp)
        if "inspect" in formats:
            from sift.export.inspect_log import export_inspect

            got["inspect"] = export_inspect(src, tmp)
        (tmp / "export.json").write_text(json.dumps(got, indent=1))
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the export is a folder like any other
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return got


__all__ = ["FORMATS", "export"]
