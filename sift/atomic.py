"""Atomic file writes: a reader never sees a half-written file."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Write to a temporary file in the same folder, then rename it over ``path`` (mode 0666 less the umask,
    as ``open`` would give, not mkstemp's 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fchmod(fh.fileno(), 0o666 & ~_umask())
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: str | Path, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON."""
    with atomic_open(path) as fh:
        json.dump(obj, fh, indent=2, sort_keys=False, default=str)
        fh.write("\n")


def write_text(path: str | Path, text: str) -> None:
    """Atomically write text."""
    with atomic_open(path) as fh:
        fh.write(text)
