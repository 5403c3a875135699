"""Provenance stamped on every artifact: config hash, seeds, model id, package version."""

from __future__ import annotations

import hashlib
import json
import platform
from typing import Any, Mapping

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
