"""Lightning callback: meta-faithfulness of the detector at the end of every validation / test epoch.

:class:`MetaEvalCallback` runs the detector (eval mode, no grad) on the DataModule's verified pairs of the
evaluated split (``pair_dataloader(split)``) and on the split's traces (``val_dataloader()`` /
``test_dataloader()``, for the SGR calibration), accumulates them in a
:class:`~sift.evaluation.training_metrics.MetaFaithfulness` metric and logs

``<stage>/ivr/<axis>``, ``<stage>/ivr``, ``<stage>/as``, ``<stage>/mfs`` (full coverage, κ = 1),
``<stage>/coverage`` (= ``<stage>/sgr_coverage``, the SGR-certified coverage κ), ``<stage>/sgr_threshold``,
``<stage>/sgr_risk``, ``<stage>/sgr_bound`` and ``<stage>/cert/{ivr,as,mfs}`` (certified subset, κ in MFS),

so that ``ModelCheckpoint``/``EarlyStopping`` can monitor them (e.g. ``monitor=val/mfs``). Under DDP each rank
evaluates every world_size-th batch and the metric's states are gathered, so each pair counts once.

Verdict threshold: outside ``fit`` the detector's frozen ``threshold``. During ``fit`` the callback runs before
the LightningModule's own ``on_validation_epoch_end``, which re-freezes the threshold on this epoch's
validation predictions; the callback therefore freezes it the same way (``fit_threshold`` with the detector's
``threshold_method`` on the validation traces it has just scored) so the logged numbers belong to the
threshold stored in this epoch's checkpoint.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import pytorch_lightning as pl
import torch

from sift.evaluation.training_metrics import MetaFaithfulness


def _split_loader(dm: Any, split: str):
    fn = {"val": "val_dataloader", "test": "test_dataloader", "transfer": "transfer_dataloader"}.get(split)
    if fn is None or not hasattr(dm, fn):
        return None
    return getattr(dm, fn)()


class MetaEvalCallback(pl.Callback):
    """Log IVR per axis, AS, MFS, SGR coverage and certified MFS at validation/test epoch end.

    Args:
        every_n_epochs: run on validation epochs ``current_epoch % every_n_epochs == 0`` and on the last one
            (0: only in ``validate``/``test``, never during ``fit``).
        on_validation / on_test: where to run.
        alpha, delta, bound, candidates: SGR parameters (:func:`sift.metrics.sgr`).
        max_pairs: evaluate at most this many pairs per split (None: all), taken in loader order.
        batch_size: pair batch size (None: the DataModule's).
        axes: preserving axes to report (None: the preserving axes present in the split's pairs).
    """

    def __init__(self, every_n_epochs: int = 1, on_validation: bool = True, on_test: bool = True,
                 alpha: float | None = None, delta: float | None = None, bound: str | None = None,
                 candidates: Sequence[float] | None = None, max_pairs: int | None = None,
                 batch_size: int | None = None, axes: Sequence[str] | None = None) -> None:
        super().__init__()
        self.every_n_epochs, self.on_validation, self.on_test = int(every_n_epochs), on_validation, on_test
        self.alpha, self.delta, self.bound = alpha, delta, bound  # None: the packaged default (MetaFaithfulness)
        self.candidates = list(candidates) if candidates is not None else None
        self.max_pairs, self.batch_size = max_pairs, batch_size
        self.axes = list(axes) if axes is not None else None
        self._warned = False
        self.last: dict[str, float] = {}  # the last logged values (for inspection and tests)

    # ---------------------------------------------------------------------------------------------- hooks
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.on_validation or trainer.sanity_checking:
            return
        fitting = trainer.state.fn == "fit"
        if fitting:
            if self.every_n_epochs <= 0:
                return
            last = trainer.max_epochs is not None and trainer.current_epoch + 1 >= trainer.max_epochs
            if trainer.current_epoch % self.every_n_epochs and not last:
                return
        self._run(trainer, pl_module, "val", "val", refit_threshold=fitting)

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.on_test:
            self._run(trainer, pl_module, "test", "test", refit_threshold=False)

    # ---------------------------------------------------------------------------------------------- work
    def _datamodule(self, trainer: pl.Trainer) -> Any:
        dm = getattr(trainer, "datamodule", None)
        if dm is None or not hasattr(dm, "pair_dataloader") or not hasattr(dm, "pairs"):
            if not self._warned:
                warnings.warn("MetaEvalCallback: the DataModule has no pair_dataloader/pairs; nothing logged",
                              stacklevel=2)
                self._warned = True
            return None
        return dm

    @torch.no_grad()
    def compute(self, pl_module: Any, dm: Any, split: str, refit_threshold: bool = False,
                rank: int = 0, world_size: int = 1) -> dict[str, float]:
        """Score ``split``'s traces and pairs with ``pl_module`` and return the metric values (no logging)."""
        from sift.detectors.thresholds import confidence_gate, fit_threshold

        was = pl_module.training
        pl_module.eval()
        dev = pl_module.device
        try:
            # traces of the split: SGR calibration (and this epoch's threshold during fit). Every rank scores all
            # of them (the threshold must agree across ranks); only rank 0 adds them to the metric, so the
            # gathered state holds each trace once. Pairs are split over the ranks.
            probs, labels, items = [], [], []
            loader = _split_loader(dm, split)
            for b in loader if loader is not None else []:
                probs.append(pl_module(b.to(dev)).float().reshape(-1).cpu())
                labels.append(b.label.reshape(-1).cpu())
                items.extend(str(x) for x in getattr(b, "base_item", []))
            p = torch.cat(probs) if probs else torch.zeros(0)
            y = torch.cat(labels) if labels else torch.zeros(0)
            threshold = float(pl_module.threshold)
            if refit_threshold and p.numel():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    threshold = fit_threshold(p.numpy(), y.numpy(), getattr(pl_module, "threshold_method", "youden"))
            pairs = dm.pairs(split)
            if self.max_pairs is not None:
                pairs = pairs[: self.max_pairs]
            axes = self.axes or sorted({q.axis for q in pairs if q.kind == "preserving"})
            metric = MetaFaithfulness(axes or ["none"], self.alpha, self.delta, self.bound, self.candidates,
                                      sync_on_compute=world_size > 1)
            if rank == 0:
                metric.update_traces(confidence_gate(p), ((p >= threshold).long() == y.long()).long(),
                                     items if len(items) == p.numel() else None)
            n_done = 0
            for i, pb in enumerate(dm.pair_dataloader(split, batch_size=self.batch_size)):
                chunk = pb.pairs
                if self.max_pairs is not None and n_done >= self.max_pairs:
                    break
                keep = len(chunk) if self.max_pairs is None else min(len(chunk), self.max_pairs - n_done)
                n_done += len(chunk)
                if i % world_size != rank:
                    continue
                ps = pl_module(pb.source.to(dev)).float().reshape(-1)[:keep].cpu()
                pd = pl_module(pb.shifted.to(dev)).float().reshape(-1)[:keep].cpu()
                chunk = chunk[:keep]
                sel = [j for j, q in enumerate(chunk) if q.kind == "altering" or q.axis in axes]
                if not sel:
                    continue
                idx = torch.tensor(sel)
                metric.update_pairs(axis=[chunk[j].axis for j in sel], kind=[chunk[j].kind for j in sel],
                                    verdict_source=(ps[idx] >= threshold).long(),
                                    verdict_shifted=(pd[idx] >= threshold).long(),
                                    label_source=torch.tensor([chunk[j].phi_source for j in sel]),
                                    label_shifted=torch.tensor([chunk[j].phi_shifted for j in sel]),
                                    rho_source=confidence_gate(ps[idx]), rho_shifted=confidence_gate(pd[idx]))
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*compute.*before.*update.*")
                vals = metric.compute()
        finally:
            pl_module.train(was)
        out = {k: float(v) for k, v in vals.items() if not (k.startswith("ivr/") and not axes)}
        out["sgr_coverage"] = out["coverage"]
        out["threshold"] = threshold
        return out

    def _run(self, trainer: pl.Trainer, pl_module: pl.LightningModule, split: str, stage: str,
             refit_threshold: bool) -> None:
        dm = self._datamodule(trainer)
        if dm is None:
            return
        vals = self.compute(pl_module, dm, split, refit_threshold, trainer.global_rank, trainer.world_size)
        vals.pop("threshold", None)
        self.last = {f"{stage}/{k}": v for k, v in vals.items()}
        for k, v in self.last.items():
            pl_module.log(k, torch.tensor(v, dtype=torch.float32), sync_dist=False, rank_zero_only=False)
