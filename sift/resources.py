"""Where the package data lives: the Hydra configs and the shipped organism weights.

Both are package data inside ``sift`` (``sift/configs/`` and ``sift/weights/organism/``), found through
:mod:`importlib.resources`, so an editable install, ``pip install .`` and an installed wheel all find them
from any working directory. The repository's top-level ``configs/`` and ``checkpoints/`` are links to them.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from sift.errors import SiftError


def _package_dir(*parts: str) -> Path:
    """A folder of package data as a real path (Hydra and ``from_pretrained`` need one)."""
    node = resources.files("sift").joinpath(*parts)
    path = Path(str(node))
    if not path.is_dir():
        raise SiftError(f"package data {'/'.join(parts)!r} not found at {path}: the sift install is incomplete "
                        f"(reinstall with `pip install .`, or from a wheel built by `pip wheel . --no-deps`)")
    return path


def config_dir() -> Path:
    """The folder of sift's Hydra configs (``corpus.yaml``, ``train.yaml`` … and their groups)."""
    return _package_dir("configs")


def organism_checkpoints() -> Path:
    """The folder of the shipped organism weights (``gpt2/`` and ``llama/``, plus the model card)."""
    return _package_dir("weights", "organism")
