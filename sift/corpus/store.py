"""Corpus files on disk: JSON Lines written atomically, resumable chunks, the final three files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from tqdm import tqdm

from sift.atomic import atomic_open, write_json
from sift.errors import SiftError


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    """Atomically write one JSON object per line."""
    with atomic_open(path) as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, record) for each non-blank line; a bad line raises naming the file and line."""
    with open(path) as fh:
        for ln, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield ln, json.loads(line)
            except json.JSONDecodeError as e:
                raise SiftError(f"{path}:{ln}: not valid JSON ({e.msg})") from None


def read_jsonl(path: str | Path) -> list[dict]:
    return [r for _, r in iter_jsonl(path)]


def run_chunks(chunks: Sequence, parts_dir: Path, chash: str, build: Callable[[object], list[dict]], *,
               desc: str, progress: bool = True) -> tuple[list[dict], int]:
    """Build each chunk once: a finished chunk lives in ``parts_dir`` under the config hash and is reused."""
    parts_dir.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    reused = 0
    for ci, chunk in enumerate(tqdm(chunks, desc=desc, disable=not progress)):
        part = parts_dir / f"chunk-{ci:04d}-{chash}.jsonl"
        if part.exists():
            records += read_jsonl(part)
            reused += 1
            continue
        recs = build(chunk)
        write_jsonl(part, recs)
        records += recs
    return records, reused


def write_corpus(out_dir: str | Path, records: list[dict], pairs: list[dict], manifest: dict,
                 plot: bool = True) -> None:
    """traces.jsonl, pairs.jsonl, manifest.json (and manifest.png), each written atomically, manifest last."""
    out_dir = Path(out_dir)
    write_jsonl(out_dir / "traces.jsonl", records)
    write_jsonl(out_dir / "pairs.jsonl", pairs)
    if plot and manifest.get("axes"):
        from sift.corpus.plots import plot_manifest

        plot_manifest(manifest, out_dir / "manifest.png")
    write_json(out_dir / "manifest.json", manifest)
