"""Seed ensembles: average the probabilities of N detectors (paper App. C.5, Table 17).

An :class:`EnsembleDetector` is itself a detector (same predict API, threshold, gate ρ); its threshold is
re-frozen on in-distribution validation for the averaged probability (members' own thresholds are ignored).
The paper's "four-detector instance-level ensemble" is four seeds of the instance-level MLP
(``sift-train detector=instance_level ensemble.n_members=4``, ``configs/experiment/instance_ensemble.yaml``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from datamodules.batch import TraceBatch
from sift.detectors.module import DetectorModule, load_detector
from sift.errors import SiftError


def member_seeds(seed: int, n_members: int) -> list[int]:
    """Seeds of the members of ensemble ``seed``: disjoint blocks (seed·N … seed·N+N−1), so ensembles of
    different seeds share no member."""
    return [seed * n_members + i for i in range(n_members)]


#: the entry of an ensemble file (:meth:`EnsembleDetector.save`): members, name, ``of`` (the members' detector)
ENSEMBLE_FILE_KEY = "sift_ensemble"


class EnsembleDetector(DetectorModule):
    """Probability average of ``members`` (any detectors). Not trainable itself."""

    def __init__(self, members: Sequence[DetectorModule], name: str = "ensemble",
                 threshold_method: str = "youden") -> None:
        if not members:
            raise SiftError("an ensemble needs at least one member")
        super().__init__(name=name, threshold_method=threshold_method)
        self.members = nn.ModuleList(members)
        for m in self.members:
            m.eval()

    def encode(self, batch: TraceBatch) -> tuple[torch.Tensor, None]:
        p = self.probs(batch).clamp(1e-7, 1 - 1e-7)
        return torch.logit(p), None

    def probs(self, batch: TraceBatch) -> torch.Tensor:
        return torch.stack([m.probs(batch) for m in self.members]).mean(0)

    def forward(self, batch: TraceBatch) -> torch.Tensor:
        return self.probs(batch)

    def train(self, mode: bool = True) -> EnsembleDetector:  # members always stay in eval mode
        super().train(mode)
        for m in self.members:
            m.eval()
        return self

    def training_step(self, *args: Any, **kwargs: Any) -> None:
        raise SiftError("an ensemble is not trained; train its members and freeze its threshold")

    def configure_optimizers(self) -> None:
        return None

    @classmethod
    def from_checkpoints(cls, paths: Iterable[str | Path], **kwargs: Any) -> EnsembleDetector:
        return cls([load_detector(str(p)) for p in paths], **kwargs)

    def save(self, path: str | Path, member_paths: Sequence[str | Path]) -> None:
        """Write a small ensemble file: member checkpoint paths + the frozen threshold."""
        names = {m.detector_name for m in self.members}
        torch.save({ENSEMBLE_FILE_KEY: {"members": [str(p) for p in member_paths], "name": self.detector_name,
                                        "of": names.pop() if len(names) == 1 else None,
                                        "threshold": float(self.threshold),
                                        "threshold_method": self.threshold_method}}, str(path))

    @classmethod
    def load(cls, path: str | Path) -> EnsembleDetector:
        from sift.checkpoints import load_checkpoint

        info = load_checkpoint(path, what="ensemble file").get(ENSEMBLE_FILE_KEY)
        if not isinstance(info, dict) or not isinstance(info.get("members"), list):
            raise SiftError(f"{path}: not a sift ensemble file (no {ENSEMBLE_FILE_KEY!r} entry)")
        ens = cls.from_checkpoints(info["members"], name=info["name"], threshold_method=info["threshold_method"])
        ens.threshold.fill_(info["threshold"])
        return ens
