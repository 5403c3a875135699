"""Corpus sources behind one protocol: a source turns its config into a corpus folder (``traces.jsonl``,
``pairs.jsonl``, ``manifest.json``) and returns the manifest.

Sources are found by name (the ``type`` of the ``source`` config node). The built-in ones are ``organism``
(:mod:`sift.corpus.sources.organism`) and ``hf`` (:mod:`sift.corpus.sources.hf`); another source is a module
holding a class with :class:`CorpusSource`'s members, decorated with :func:`register_source`, plus its config
dataclass in :data:`sift.corpus.config.SOURCE_CONFIGS` and a ``configs/source/<name>.yaml``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, ClassVar, Protocol

from omegaconf import DictConfig

from sift.errors import SiftError


class CorpusSource(Protocol):
    """What the corpus stage needs of a source."""

    name: ClassVar[str]

    def build(self, cfg: Any, out_dir: str | Path, *, progress: bool = True,
              engine: DictConfig | None = None) -> dict[str, Any]:
        """Build the corpus of ``cfg`` (the source's config dataclass) into ``out_dir``; return its manifest.
        ``engine`` (:func:`sift.corpus.store.engine_config`) says where the chunks run."""
        ...

    def families(self, cfg: Any) -> list[str]:
        """The model family labels of the corpus (``record["family"]``; the held-out-model transfer runs)."""
        ...

    def models(self, cfg: Any) -> dict[str, str]:
        """family label → the model (folder or cached hub name) whose hidden states the trajectory stage reads."""
        ...


#: registered sources by name
SOURCES: dict[str, CorpusSource] = {}

#: the modules of the built-in sources (imported on first use: their models need torch and transformers)
BUILTIN = {"organism": "sift.corpus.sources.organism", "hf": "sift.corpus.sources.hf"}


def register_source(cls: type) -> type:
    """Class decorator: register an instance of a :class:`CorpusSource` under its ``name``."""
    SOURCES[cls.name] = cls()
    return cls


def get_source(name: str) -> CorpusSource:
    """The source registered as ``name`` (a built-in one is imported here)."""
    if name not in SOURCES and name in BUILTIN:
        importlib.import_module(BUILTIN[name])
    if name not in SOURCES:
        known = sorted(set(SOURCES) | set(BUILTIN))
        raise SiftError(f"source.type must be one of {', '.join(map(repr, known))}, got {name!r}")
    return SOURCES[name]
