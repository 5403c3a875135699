"""``sift_raw``: SIFT over the raw hidden states (paper Appendix Q), beside ``sift`` over the §5 descriptors.

The paper describes two SIFTs. §5–6 build the detector on hand-made per-step descriptors (velocity, drift, early
commitment, attention stability): :class:`~sift.detectors.sift_model.SIFTDetector`. Appendix Q writes the
representation as ψ(H) = TCN(H) over the raw states, uses mean-pooled raw states as a baseline, and recommends
learned representations over hand-crafted features. ``sift_raw`` is that reading: the same network
(:class:`~sift.detectors.sift_model.SIFTNet`), objective and schedule as ``sift``, whose input at each step is the
source model's final-layer state at that step (the descriptor steps: the CoT's tokens binned to at most ``t_max``
steps, ``TraceBatch.states``), standardised per coordinate on the training steps and projected by a learned linear
map to ``projection.dim`` channels. Difference-based descriptors cancel an offset shared by every step; the raw
states keep it, and keep whatever a routing writes into the CoT's states.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from datamodules.batch import TraceBatch
from sift.detectors.module import DataSpec, DetectorModule, Standardizer, build_net
from sift.detectors.sift_model import SIFTNet
from sift.errors import SiftError


class RawSIFTDetector(DetectorModule):
    """``sift_raw`` (module docstring). ``projection``: ``{dim}``, the width the states are projected to (SIFTNet's
    ``in_channels``); ``net``, ``optimizer``, ``scheduler``, ``objective``: as for ``sift``."""

    objective_defaults: ClassVar[dict[str, Any]] = {"use_irm": True, "use_dann": True}
    stack_net: ClassVar[type | None] = SIFTNet

    def __init__(self, *, data: DataSpec | Mapping[str, Any] | None = None, name: str = "sift_raw",
                 projection: Mapping[str, Any] | None = None, net: Mapping[str, Any] | None = None,
                 optimizer: Mapping[str, Any] | None = None, scheduler: Mapping[str, Any] | None = None,
                 objective: Mapping[str, Any] | None = None, standardize: bool = True,
                 threshold_method: str = "youden") -> None:
        super().__init__(data=data, name=name, optimizer=optimizer, scheduler=scheduler, objective=objective,
                         threshold_method=threshold_method)
        self.save_hyperparameters(logger=False)
        if self.pooled_dim < 1:
            raise SiftError(f"{name}: the DataModule gives no hidden-state width (pooled_dim = {self.pooled_dim}); "
                            "this detector needs the trajectory DataModule (data=trajectory)")
        dim = int(dict(projection or {}).get("dim", 64))
        if dim < 1:
            raise SiftError(f"{name}: projection.dim must be ≥ 1, got {dim}")
        self.standardizer = Standardizer(self.pooled_dim) if standardize else None
        self.project = nn.Linear(self.pooled_dim, dim)
        self.net = build_net(net, SIFTNet, in_channels=dim)
        self.representation_dim = int(self.net.d_model)
        self.build_dann_head()

    def _states(self, batch: TraceBatch) -> torch.Tensor:
        if batch.states is None:
            raise SiftError(f"{self.detector_name}: the batch carries no per-step states (TraceBatch.states); this "
                            "detector needs the trajectory DataModule (data=trajectory)")
        if batch.states.shape[-1] != self.pooled_dim:
            raise SiftError(f"{self.detector_name}: states of width {batch.states.shape[-1]}, the detector was built "
                            f"for {self.pooled_dim}")
        return batch.states

    def stack_inputs(self, batch: TraceBatch) -> tuple[torch.Tensor, torch.Tensor]:
        x = self._states(batch)
        if self.standardizer is not None:
            x = self.standardizer(x)
        return self.project(x) * batch.mask[..., None].to(x.dtype), batch.mask

    def encode(self, batch: TraceBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(*self.stack_inputs(batch))

    def fit_input_stats(self, batches: Iterable[TraceBatch]) -> None:
        if self.standardizer is None:
            return
        for b in batches:
            self.standardizer.update(self._states(b)[b.mask.bool()])
        self.standardizer.finalize()


__all__ = ["RawSIFTDetector"]
