"""Shared CLI plumbing: where the configs live, one-line errors, the output lock, clean interrupts.

A failure never deletes finished work: only empty folders the failing command created are removed.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sift.config import register_resolvers
from sift.errors import SiftError
from sift.resources import config_dir

register_resolvers()

#: sift's Hydra configs (package data); ``--config-dir DIR`` on any command adds a folder that overrides them
CONFIG_DIR = str(config_dir())

#: the environment variable naming the user's config folder (searched before sift's own configs)
USER_CONFIG_ENV = "SIFT_CONFIG_DIR"


def _pop_config_dir(argv: list[str]) -> str | None:
    """Remove ``--config-dir DIR`` / ``--config-dir=DIR`` / ``-cd DIR`` from ``argv``; return DIR (or None)."""
    for i, a in enumerate(argv):
        if a in ("--config-dir", "-cd"):
            if i + 1 >= len(argv):
                raise SiftError(f"{a}: expected a folder of configs after it")
            d = argv[i + 1]
            del argv[i:i + 2]
            return d
        if a.startswith("--config-dir="):
            del argv[i]
            return a.split("=", 1)[1]
    return None


def sift_main(config_name: str) -> Callable[[Callable[[DictConfig], Any]], Callable[[], Any]]:
    """``hydra.main`` over sift's packaged configs, where ``--config-dir DIR`` overrides them: a file in DIR
    (a primary config like ``train.yaml`` or a group option like ``detector/sift.yaml``) wins over sift's,
    and new group options in DIR become selectable. DIR travels to worker processes as ``$SIFT_CONFIG_DIR``."""
    import functools

    import hydra

    def deco(task: Callable[[DictConfig], Any]) -> Callable[[], Any]:
        @functools.wraps(task)
        def main() -> Any:
            prog = Path(sys.argv[0]).name
            try:
                user = _pop_config_dir(sys.argv)
                if user is not None and not Path(user).is_dir():
                    raise SiftError(f"--config-dir {user}: no such folder")
            except SiftError as e:
                print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
                sys.exit(2)
            if user is not None:
                os.environ[USER_CONFIG_ENV] = str(Path(user).resolve())
            return hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name=config_name)(task)()

        return main

    return deco


#: the signal that interrupted this process (set by the SIGTERM handler and by Ctrl-C)
_interrupted: dict[str, int] = {}


def _on_sigterm(signum: int, frame: Any) -> None:
    _interrupted["signal"] = signum
    raise KeyboardInterrupt(f"signal {signum}")


def _prune_new_empty_dirs(root: Path, existed: set[Path]) -> None:
    """Remove the empty folders under (and including) ``root`` that did not exist before; never a file."""
    if not root.is_dir():
        return
    for d, _, _ in sorted(os.walk(root), key=lambda w: -len(w[0])):
        p = Path(d)
        if p in existed:
            continue
        lock = p / ".sift.lock"
        try:
            if lock.is_file() and lock.stat().st_size == 0 and len(os.listdir(p)) == 1:
                lock.unlink()
            p.rmdir()  # only succeeds when empty
        except OSError:
            pass


def _only_hydra_files(root: Path) -> bool:
    """``root`` holds nothing but what Hydra writes at startup (``.hydra/``, ``<task>.log``), the lock file and
    empty folders."""
    if not root.is_dir():
        return False
    for d, _, files in os.walk(root):
        rel = Path(d).relative_to(root)
        if rel.parts[:1] == (".hydra",):
            continue
        if any(not (rel == Path(".") and (f.endswith(".log") or f == ".sift.lock")) for f in files):
            return False
    return True


def _remove_hydra_files(root: Path) -> None:
    import shutil

    shutil.rmtree(root / ".hydra", ignore_errors=True)
    for f in root.glob("*.log"):
        f.unlink(missing_ok=True)


def _existing_dirs(root: Path) -> set[Path]:
    return {Path(d) for d, _, _ in os.walk(root)} if root.is_dir() else set()


@contextmanager
def clean_failure(prog: str, out_dir: str | Path | None, lock: bool = True) -> Iterator[None]:
    """Run a command body: take the lock on ``out_dir``; a SiftError or OSError becomes one stderr line and
    exit 2; Ctrl-C / SIGTERM stop cleanly (exit 130 / 143, a rerun resumes). On failure only the empty folders
    this command created are removed; files are never deleted."""
    from sift.lock import OutputLock

    root = Path(out_dir) if out_dir is not None else None
    parents = [] if root is None else [p for p in (root, *root.parents) if not p.exists()]
    existed = _existing_dirs(root) if root is not None else set()
    hydra_only = root is not None and _only_hydra_files(root)  # a folder Hydra just made for this command
    if hydra_only:
        existed = set()
    old = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
    held: OutputLock | None = None
    code, msg = 0, ""
    try:
        # a DDP worker that Lightning launched (LOCAL_RANK ≥ 1) runs under the lock its rank-0 parent holds
        if root is not None and lock and int(os.environ.get("LOCAL_RANK", "0") or 0) == 0:
            held = OutputLock(root, prog).acquire()
        yield
    except SiftError as e:
        code, msg = 2, f"{prog}: error: {e}"
    except OSError as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        code, msg = 2, f"{prog}: error: {where}{e.strerror or e}"
    except (KeyboardInterrupt, SystemExit) as e:
        if isinstance(e, SystemExit) and not _interrupted and not isinstance(e.__context__, KeyboardInterrupt):
            raise
        sig = _interrupted.get("signal", signal.SIGINT)
        code, msg = 128 + sig, f"{prog}: interrupted ({signal.Signals(sig).name}); rerun the same command to resume"
    finally:
        if held is not None:
            held.release()
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    if code:
        if root is not None:
            if hydra_only and _only_hydra_files(root):
                _remove_hydra_files(root)
            _prune_new_empty_dirs(root, existed)
            for p in parents[1:]:
                try:
                    p.rmdir()
                except OSError:
                    break
        print(msg, file=sys.stderr, flush=True)
        sys.exit(code)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
