"""Provenance stamped on every artifact: config hash, seeds, model id, package version."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sift import __version__


def canonical_json(obj: Any) -> str:
    """Deterministic JSON (sorted keys, no whitespace) used for hashing."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def config_hash(cfg: Mapping[str, Any] | Any) -> str:
    """Short SHA-256 of a config (a mapping or an OmegaConf node)."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            cfg = OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return hashlib.sha256(canonical_json(cfg).encode()).hexdigest()[:16]


def content_hash(*parts: Any) -> str:
    """SHA-256 over several JSON-able parts (for cache keys)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(canonical_json(p).encode())
        h.update(b"\x00")
    return h.hexdigest()[:16]


def provenance(cfg: Mapping[str, Any] | Any, **extra: Any) -> dict[str, Any]:
    """The provenance record written beside every artifact."""
    import torch

    return {
        "sift_version": __version__,
        "config_hash": config_hash(cfg),
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        **extra,
    }


FULL_HASH_LIMIT = 512 * 1024 * 1024  # larger files are fingerprinted by size + first and last 8 MiB


def file_sha256(path: str | Path, limit: int | None = FULL_HASH_LIMIT) -> str:
    """Streamed SHA-256 of a file (size + head and tail only for files above ``limit``)."""
    path = Path(path)
    h = hashlib.sha256()
    size = path.stat().st_size
    with open(path, "rb") as fh:
        if limit is not None and size > limit:
            h.update(str(size).encode())
            h.update(fh.read(8 << 20))
            fh.seek(size - (8 << 20))
            h.update(fh.read())
        else:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def model_fingerprint(name_or_path: str) -> str:
    """Content fingerprint of a model folder or file (config, tokenizer, weights); the name for hub models."""
    p = Path(os.path.expanduser(name_or_path))
    if p.is_file():
        return file_sha256(p)[:16]
    if p.is_dir():
        parts = []
        for f in sorted(p.rglob("*")):
            if f.is_file() and not f.name.startswith(".") and f.suffix in (".json", ".safetensors", ".bin", ".model",
                                                                            ".gguf", ".txt", ".pt"):
                parts.append((str(f.relative_to(p)), file_sha256(f)))
        return content_hash(parts)
    return content_hash(["hub", name_or_path])
