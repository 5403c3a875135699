"""Checkpoints as data: safe loading of user files, and a ModelCheckpoint whose ``last.ckpt`` is every epoch's.

Every checkpoint sift reads from a user path goes through :func:`load_checkpoint`, which unpickles with
``torch.load(weights_only=True)`` (tensors, containers and plain values only: a crafted file cannot run code)
and turns any failure into one :class:`SiftError` line. Pickle bytes stored as a value (how sift's earlier format kept a
control's estimator) are refused too, without being unpickled. Remote locations (``http://``, ``s3://`` …) are refused
unless the caller opts in.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint as _LightningModelCheckpoint

from sift.errors import SiftError

REMOTE_PREFIXES = ("http://", "https://", "ftp://", "s3://", "gs://", "gcs://", "az://", "abfs://", "hf://")
#: where sift's earlier format kept a control's scikit-learn estimator: pickle bytes (refused, never unpickled)
LEGACY_ESTIMATOR_KEY = "sklearn_estimator"
#: the leading bytes of a pickle stream of protocol 2–5 (what ``pickle.dumps`` writes)
_PICKLE_MAGIC = tuple(bytes([0x80, p]) for p in range(2, 6))


def is_pickle_blob(value: Any) -> bool:
    """True for bytes (or a uint8 tensor) that open with a pickle protocol header."""
    if isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1 and value.numel() >= 2:
        value = value[:2].numpy().tobytes()
    return isinstance(value, (bytes, bytearray)) and bytes(value[:2]) in _PICKLE_MAGIC


def refuse_pickle_entries(checkpoint: Mapping[str, Any], path: str = "checkpoint") -> None:
    """Refuse, in one line, a checkpoint with the old estimator entry or pickle bytes in any top-level entry."""
    for key, value in checkpoint.items():
        if (key == LEGACY_ESTIMATOR_KEY and value is not None) or is_pickle_blob(value):
            name = (checkpoint.get("sift_detector") or {}).get("name", "DETECTOR")
            what = "its scikit-learn estimator" if key == LEGACY_ESTIMATOR_KEY else f"entry {key!r}"
            raise SiftError(f"{path}: refused: {what} is stored as pickle bytes, which sift never loads (unpickling "
                            f"can run code); retrain it (a closed-form fit of seconds): sift-train detector={name} "
                            f"seed=N data.trajectory_dir=DIR, or rerun the job, which refits it")


def is_remote(path: str | Path) -> bool:
    """True for a URL or fsspec remote location rather than a local file."""
    s = str(path).strip().lower()
    return "://" in s and not s.startswith("file://")


def check_local(path: str | Path, what: str = "checkpoint", allow_remote: bool = False) -> None:
    """Refuse a remote ``path`` unless ``allow_remote``; refuse a missing local file."""
    if is_remote(path):
        if not allow_remote:
            raise SiftError(f"{what} {str(path)!r} is a remote location; sift loads only local files "
                            f"(download it yourself, or pass allow_remote_ckpt=true to opt in)")
        return
    if not Path(path).is_file():
        raise SiftError(f"{what} {path}: no such file")


def load_checkpoint(path: str | Path, map_location: Any = "cpu", what: str = "checkpoint") -> dict[str, Any]:
    """``torch.load(path, weights_only=True)`` with one clear line for a missing, remote, garbage or unsafe file."""
    check_local(path, what)
    try:
        obj = torch.load(str(path), map_location=map_location, weights_only=True)
    except Exception as e:  # UnpicklingError (unsafe global), RuntimeError/EOFError (garbage), ...
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "weights_only" in str(e) or "Unsupported global" in str(e) or "GLOBAL" in str(e):
            raise SiftError(f"{path}: refused: the {what} holds Python objects beyond tensors and plain values "
                            f"(only weights_only checkpoints are loaded; {msg[:160]})") from None
        raise SiftError(f"{path}: not a readable {what} ({type(e).__name__}: {msg[:160]})") from None
    if not isinstance(obj, dict):
        raise SiftError(f"{path}: not a {what} (holds a {type(obj).__name__}, expected a dict)")
    refuse_pickle_entries(obj, str(path))
    return obj


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states (all tensors / plain values, so weights_only loading keeps them)."""
    np_state = np.random.get_state()
    return {"python": repr(random.getstate()), "numpy_keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "numpy_pos": int(np_state[2]), "numpy_gauss": [int(np_state[3]), float(np_state[4])],
            "torch": torch.get_rng_state()}


def set_rng_state(s: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    import ast

    v = ast.literal_eval(s["python"])
    random.setstate((v[0], tuple(v[1]), v[2]))
    has_gauss, gauss = s["numpy_gauss"]
    np.random.set_state(("MT19937", s["numpy_keys"].numpy().astype(np.uint32), int(s["numpy_pos"]),
                         int(has_gauss), float(gauss)))
    torch.set_rng_state(s["torch"])


class ModelCheckpoint(_LightningModelCheckpoint):
    """Lightning's ModelCheckpoint, with three changes that make a killed run resume exactly:

    * ``last.ckpt`` is written after every validation epoch, not only when a new best is saved;
    * every checkpoint file is written atomically (temporary file + rename), so a kill never leaves half a file;
    * the checkpoint carries the RNG states taken when it was written (at the end of an epoch), put back when
      the next training epoch starts after a resume (restoring them earlier would let the resumed run's setup,
      e.g. its sanity check, draw from them).

    Exact resume also needs the data side: Lightning creates a resumed run's first training iterator *before*
    ``on_train_epoch_start`` (an uninterrupted run creates epoch N's after it), so sift's DataModules draw
    their order from ``(seed, epoch)`` (:class:`datamodules.batch.EpochShuffleSampler`) and give every
    DataLoader a private generator: creating an iterator never touches the global RNG restored here. That first
    iterator is even created before the epoch counter is restored, so ``on_train_start`` creates it again.
    """

    _pending_rng: dict[str, Any] | None = None

    def _save_last_anyway(self, trainer: pl.Trainer, at_train_epoch_end: bool) -> None:
        """After Lightning's hook: write ``last.ckpt`` when Lightning skipped it (no new best this epoch)."""
        if (self.save_last and not self._should_skip_saving_checkpoint(trainer)
                and self._should_save_on_train_epoch_end(trainer) == at_train_epoch_end):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
        if self._pending_rng is not None and fetcher is not None:
            # a resumed run: Lightning created its first training iterator in ``_FitLoop.setup_data``, before
            # ``on_run_start`` set ``current_epoch`` from the checkpoint, and keeps it for the resumed epoch; sift's
            # samplers read the epoch when an iterator is created, so create it again now (no batch was drawn)
            iter(fetcher)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._pending_rng is not None:
            set_rng_state(self._pending_rng)
            self._pending_rng = None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        self._save_last_anyway(trainer, at_train_epoch_end=True)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        self._save_last_anyway(trainer, at_train_epoch_end=False)

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        tmp = f"{filepath}.tmp{os.getpid()}"
        super()._save_checkpoint(trainer, tmp)
        if trainer.is_global_zero:
            os.replace(tmp, filepath)
        self._last_checkpoint_saved = filepath

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "rng": rng_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        rng = state_dict.pop("rng", None)
        super().load_state_dict(state_dict)
        self._pending_rng = rng
