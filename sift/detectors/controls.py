"""Shortcut controls as detectors (docs/design.md §4 "Validity"; issue 11): trained, thresholded, checkpointed and
evaluated exactly like the other detectors (``sift-train detector=text_bow|surface|prompt_probe|text_sift``).

=============  ==============================================  ======================================================
control        inputs (TraceBatch)                             model (``sift.corpus.audit``)
=============  ==============================================  ======================================================
text_bow       ``text``: prompt + CoT                          TF-IDF word 1–2-grams + char 2–4-grams → LR
surface        ``features`` columns ``surf/*`` (structured     HistGradientBoosting (categorical: ``surf/cat:*``)
               text features)
prompt_probe   ``prompt_pooled``: final-layer state of the     LR on standardised states
               last prompt token (no CoT)                      (:class:`~sift.detectors.baselines.LogisticDetector`)
text_sift      ``token_ids`` / ``token_segment``: the model's  SIFT's network, objective and schedule on learned
               token ids of prompt, CoT and answer per step    token embeddings (:mod:`sift.detectors.text_sift`)
=============  ==============================================  ======================================================

The scikit-learn estimators of ``text_bow`` and ``surface`` are fitted once on the training split (the DataModule's
flat training loader, each trace once) and kept in the checkpoint as data (``skops.io`` with an explicit trusted-type
list, :mod:`sift.detectors.estimator_state`; never a pickle, so loading a checkpoint cannot run code);
``prompt_probe`` copies its fitted logistic regression into torch buffers. The decision threshold is frozen on
validation like every other detector's. ``text_sift`` is a torch network trained like ``sift`` (it can read
interactions of words, which the linear and hand-built controls cannot). A control reads no hidden state of the CoT:
when it matches a trajectory detector, that detector may be reading the text rather than the mechanism.

The report recognises a control by its registry entry (``registry.control`` in its config; ``text_sift`` also
declares ``capacity_control``: the same-capacity text model the reference is compared with in Table 1), not by
name (:func:`sift.detectors.registry.is_control`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from datamodules.batch import TraceBatch
from datamodules.features import select_by_prefix
from sift.detectors.estimator_state import STATE_KEY, dump_estimator, load_estimator, refuse_pickle_entries
from sift.detectors.module import DataSpec, DetectorModule, as_env_batches
from sift.errors import SiftError


class SklearnDetector(DetectorModule):
    """Base class: a scikit-learn classifier on per-trace inputs (:meth:`inputs`), fitted once on the training
    split; ``encode`` returns the logit of its P(faithful)."""

    #: fitted in one pass (the training record counts it as converged, never as undertrained)
    fits_once = True
    #: the class a stored estimator must be, and the types its skops file may hold beyond skops' defaults
    estimator_class: str = ""
    trusted_types: tuple[str, ...] = ()

    def __init__(self, *, data: DataSpec | Mapping[str, Any] | None = None, name: str = "sklearn",
                 threshold_method: str = "youden") -> None:
        super().__init__(data=data, name=name, threshold_method=threshold_method)
        self.automatic_optimization = False
        self.estimator: Any = None
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))
        self._X: list[Any] = []
        self._y: list[torch.Tensor] = []

    # ---- subclass API
    def inputs(self, batch: TraceBatch) -> Any:
        """The estimator's rows for a batch (an array [B, k] or a list of B strings)."""
        raise NotImplementedError

    def make_estimator(self) -> Any:
        raise NotImplementedError

    # ---- fitting
    def needs_input_stats(self) -> bool:
        return False

    @staticmethod
    def _cat(parts: list[Any]) -> Any:
        return [s for p in parts for s in p] if parts and isinstance(parts[0], list) else np.concatenate(parts)

    def fit_arrays(self, X: Any, y: np.ndarray) -> None:
        import warnings

        y = np.asarray(y).astype(int)
        if len(np.unique(y)) < 2:
            raise SiftError(f"{self.detector_name}: training labels hold a single class")
        from threadpoolctl import threadpool_limits

        est = self.make_estimator()
        with warnings.catch_warnings(), threadpool_limits(1):  # one thread per run, like the torch detectors
            warnings.simplefilter("ignore")
            est.fit(X, y)
        self.estimator = est
        self.fitted.fill_(True)

    def on_fit_start(self) -> None:
        dm = self.trainer.datamodule
        flat = getattr(dm, "train_flat_dataloader", None) if dm is not None else None
        if bool(self.fitted) or flat is None:
            return
        X, y = [], []
        for b in flat(shuffle=False):
            X.append(self.inputs(b))
            y.append(b.label.detach().cpu())
        self.fit_arrays(self._cat(X), torch.cat(y).numpy())

    def training_step(self, batch: TraceBatch | Sequence[TraceBatch], batch_idx: int) -> None:
        if not bool(self.fitted):
            for b in as_env_batches(batch):
                self._X.append(self.inputs(b))
                self._y.append(b.label.detach().cpu())
        return None

    def _maybe_fit(self) -> None:
        if not bool(self.fitted) and self._X:
            self.fit_arrays(self._cat(self._X), torch.cat(self._y).numpy())
            self._X, self._y = [], []
        if bool(self.fitted) and self._trainer is not None:
            self.trainer.should_stop = True  # one pass over the data is all a closed-form fit needs

    def on_validation_epoch_start(self) -> None:
        if not self.trainer.sanity_checking:
            self._maybe_fit()

    def on_train_epoch_end(self) -> None:
        self._maybe_fit()

    # ---- inference
    def encode(self, batch: TraceBatch) -> tuple[torch.Tensor, None]:
        if self.estimator is None:
            # Lightning's sanity check runs before the fit: a constant until then
            return torch.zeros(len(batch), device=batch.label.device), None
        from threadpoolctl import threadpool_limits

        with threadpool_limits(1):
            p = self.estimator.predict_proba(self.inputs(batch))[:, 1]
        p = np.clip(p.astype(np.float64), 1e-7, 1 - 1e-7)
        return torch.as_tensor(np.log(p / (1 - p)), dtype=torch.float32, device=batch.label.device), None

    # ---- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[STATE_KEY] = dump_estimator(self.estimator) if self.estimator is not None else None

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        # load_checkpoint refused these already; this covers a file loaded by other means
        refuse_pickle_entries(checkpoint, f"{self.detector_name} checkpoint")
        state = checkpoint.get(STATE_KEY)
        self.estimator = None if state is None else load_estimator(
            state, expected=self.estimator_class, trusted=self.trusted_types,
            what=f"{self.detector_name} checkpoint")


class TextBowDetector(SklearnDetector):
    """``text_bow``: bag of words and character n-grams over prompt + CoT, logistic regression."""

    estimator_class = "sklearn.pipeline.Pipeline"  # TF-IDF union → LR: every part is a skops default type

    def __init__(self, *, data: DataSpec | Mapping[str, Any] | None = None, name: str = "text_bow",
                 C: float = 1.0, max_iter: int = 2000, threshold_method: str = "youden") -> None:
        super().__init__(data=data, name=name, threshold_method=threshold_method)
        self.save_hyperparameters(logger=False)
        self.C, self.max_iter = C, max_iter

    def inputs(self, batch: TraceBatch) -> list[str]:
        if len(batch.text) != len(batch):
            raise SiftError(f"{self.detector_name}: the batch carries no trace text (TraceBatch.text); this control "
                            "needs the trajectory DataModule (data=trajectory), which reads it from the corpus")
        return list(batch.text)

    def make_estimator(self) -> Any:
        from sift.corpus.audit import text_bow_estimator

        return text_bow_estimator(C=self.C, max_iter=self.max_iter)


class SurfaceDetector(SklearnDetector):
    """``surface``: gradient-boosted trees on the structured text features ``surf/*``
    (:data:`sift.corpus.audit.SURFACE_FEATURES`)."""

    estimator_class = "sklearn.ensemble._hist_gradient_boosting.gradient_boosting.HistGradientBoostingClassifier"
    # the fitted trees, and the array check its bin mapper keeps as a partial (a reference, never called on load)
    trusted_types = ("sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor", "functools.partial",
                     "sklearn.utils.validation.check_array")

    def __init__(self, *, name: str = "surface", prefix: str = "surf/", max_iter: int = 100,
                 learning_rate: float = 0.1, max_leaf_nodes: int = 31,
                 data: DataSpec | Mapping[str, Any] | None = None, threshold_method: str = "youden") -> None:
        super().__init__(data=data, name=name, threshold_method=threshold_method)
        self.save_hyperparameters(logger=False)
        try:
            self.idx = select_by_prefix(self.feature_names, [prefix])
        except SiftError as e:
            raise SiftError(f"{name}: the DataModule gives no structured text features ({e}); this control needs "
                            "the trajectory DataModule (data=trajectory)") from None
        self.columns = [self.feature_names[i] for i in self.idx]
        self.categorical = np.array([c.startswith(prefix + "cat:") for c in self.columns])
        self.max_iter, self.learning_rate, self.max_leaf_nodes = max_iter, learning_rate, max_leaf_nodes

    def inputs(self, batch: TraceBatch) -> np.ndarray:
        return batch.features[:, self.idx].detach().cpu().double().numpy()

    def make_estimator(self) -> Any:
        from sift.corpus.audit import surface_estimator

        return surface_estimator(self.categorical, max_iter=self.max_iter, learning_rate=self.learning_rate,
                                 max_leaf_nodes=self.max_leaf_nodes)


__all__ = ["SklearnDetector", "SurfaceDetector", "TextBowDetector"]
