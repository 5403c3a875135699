"""Corpus files on disk: JSON Lines written atomically, resumable chunks (computed as jobs on the execution
engine, :mod:`sift.execution`), the final three files."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from sift.atomic import atomic_open, write_json
from sift.errors import SiftError
from sift.execution import JobLabels


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    """Atomically write one JSON object per line."""
    with atomic_open(path) as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, record) for each non-blank line; a bad line (not UTF-8 JSON, or not an object) raises naming
    the file and line."""
    with open(path, "rb") as fh:
        for ln, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise SiftError(f"{path}:{ln}: not valid JSON ({e.msg})") from None
            except ValueError as e:  # UnicodeDecodeError: binary data, not a JSON Lines file
                raise SiftError(f"{path}:{ln}: not a JSON Lines record ({type(e).__name__})") from None
            if not isinstance(rec, dict):
                raise SiftError(f"{path}:{ln}: not a JSON object (a {type(rec).__name__})")
            yield ln, rec


def read_jsonl(path: str | Path) -> list[dict]:
    return [r for _, r in iter_jsonl(path)]


#: ``build(chunk) -> records``; with processes or SLURM, a picklable one (``functools.partial`` of a module-level
#: function and a plain config), which loads its model inside the worker
ChunkBuild = Callable[[Any], list[dict]]
#: the engine that computes chunks: chunk labels, failure logs ``.parts/logs/<index>/``, SLURM job ``sift-corpus``
CHUNKS = JobLabels(tag="corpus", noun="chunk", log_root="logs", job_name="sift-corpus")


@dataclass(frozen=True)
class ChunkSpec:
    """One corpus chunk as a job: build it and write its part file (atomically)."""

    key: str  # "0003": the chunk's index (with a model: "0003-m1")
    part: str  # the finished chunk's JSON Lines file
    build: ChunkBuild
    chunk: Any
    threads: int | None  # torch threads in the worker (None: leave as is)


def chunk_job(cfg_yaml: str | None, out: str, spec: ChunkSpec, gpus: list[str] | None,
              cfg: DictConfig | None = None) -> int:
    """Build one chunk in a local worker, a SLURM task or this process; returns its record count."""
    from sift.execution import select_gpu

    select_gpu(gpus)
    if spec.threads is not None:
        import torch

        torch.set_num_threads(spec.threads)
    recs = spec.build(spec.chunk)
    write_jsonl(spec.part, recs)
    return len(recs)


def engine_config(executor: Mapping[str, Any] | DictConfig | None = None, workers: int = 1) -> DictConfig:
    """The engine's config for chunks: ``executor`` (``configs/executor/*.yaml``; default local) and ``workers``."""
    if isinstance(executor, DictConfig):  # resolve ``${output_dir}`` and the like in their own config
        executor = OmegaConf.to_container(executor, resolve=True)
    e = OmegaConf.create({"kind": "local", "retries": 1} if executor is None else dict(executor))
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise SiftError(f"workers: expected a positive integer, got {workers!r}")
    return OmegaConf.create({"workers": workers, "train_overrides": [], "executor": e})


def run_chunks(chunks: Sequence, parts_dir: Path, chash: str, build: ChunkBuild, *, desc: str,
               progress: bool = True, engine: DictConfig | None = None, gpus: int = 0,
               part_names: Sequence[str] | None = None) -> tuple[list[dict], int]:
    """Build each chunk once: a finished chunk lives in ``parts_dir`` under the config hash and is reused.

    The chunks not yet built run as jobs on ``engine`` (:func:`engine_config`; default: one after the other in
    this process): ``workers`` local processes with one torch thread each, or a SLURM array job, ``gpus`` GPUs
    each; a failed chunk is retried ``executor.retries`` times. Chunks are fixed by item index and every record
    is read back from its part file in chunk order, so the corpus does not depend on the engine or ``workers``.
    ``part_names``: each chunk's part file stem (default ``chunk-<index>``), then ``-<chash>.jsonl``.
    """
    from sift.execution import run_jobs

    engine = engine if engine is not None else engine_config()
    parts_dir.mkdir(parents=True, exist_ok=True)
    stems = part_names if part_names is not None else [f"chunk-{ci:04d}" for ci in range(len(chunks))]
    if len(stems) != len(chunks):
        raise SiftError(f"run_chunks: {len(stems)} part names for {len(chunks)} chunks")
    parts = [parts_dir / f"{stem}-{chash}.jsonl" for stem in stems]
    pooled = engine.executor.kind == "local" and min(int(engine.workers), len(chunks)) > 1
    todo = [ChunkSpec(stem.removeprefix("chunk-"), str(p), build, c, 1 if pooled else None)
            for stem, c, p in zip(stems, chunks, parts) if not p.exists()]
    reused = len(chunks) - len(todo)
    with tqdm(total=len(chunks), initial=reused, desc=desc, disable=not progress) as bar:
        if todo:
            run_jobs(engine, parts_dir, todo, chunk_job, lambda spec, n: bar.update(1), labels=CHUNKS, gpus=gpus)
    records: list[dict] = []
    for p in parts:
        if not p.exists():
            raise SiftError(f"corpus chunk {p.name}: its job finished but wrote no part file in {parts_dir}")
        records += read_jsonl(p)
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
