"""The corpus stage as a library call: a composed ``corpus`` config in, a corpus folder and its manifest out."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from sift.corpus.config import SOURCE_CONFIGS
from sift.corpus.sources import get_source
from sift.errors import SiftError


def source_config(node: DictConfig) -> Any:
    """The ``source`` node as its source's config dataclass (validated against it, whatever the yaml held)."""
    kind = node.get("type")
    if kind not in SOURCE_CONFIGS:
        raise SiftError(f"source.type must be one of {', '.join(map(repr, SOURCE_CONFIGS))}, got {kind!r}")
    values = OmegaConf.to_container(node, resolve=True)  # the job-level interpolations need the parent
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SOURCE_CONFIGS[kind]), values))


def run_corpus(cfg: DictConfig, progress: bool = True) -> dict[str, Any]:
    """Build the corpus described by ``cfg`` (a composed ``corpus.yaml``) into ``cfg.output_dir``; returns the
    manifest. Prints one warning line when a shortcut control of the manifest's audit exceeds its limit
    (:mod:`sift.corpus.audit`)."""
    from sift.corpus.audit import warning_line
    from sift.corpus.store import engine_config
    from sift.execution import validate_executor

    engine = engine_config(cfg.executor, cfg.workers)
    validate_executor(engine)
    src = source_config(cfg.source)
    manifest = get_source(src.type).build(src, cfg.output_dir, progress=progress, engine=engine)
    line = warning_line(manifest)
    if line:
        print(line, flush=True)
    return manifest
