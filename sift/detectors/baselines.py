"""The five baselines of paper §7.1 on the same LightningModule contract as SIFT.

=========================  =================================================================  ==================
baseline                   inputs (DataModule names, see ``features.py``)                      model
=========================  =================================================================  ==================
biasing-features           ``features`` columns starting with ``cue/``                          LR, C = 1
counterfactual             ``features`` columns starting with ``cf/``                           MLP 64
hidden-state probe         ``pooled`` (mean-pooled final-layer state)                           LR, C = 1
prompt probe (a control)   ``prompt_pooled`` (final-layer state of the last prompt token)       LR, C = 1
instance-level             ``features`` columns starting with ``beh/`` or ``int/``              MLP 128
attribution-consistency    mean of channel ``attention_stability`` over real steps             1-D LR (threshold)
=========================  =================================================================  ==================

Logistic regressions are fitted once by scikit-learn (``LogisticRegression``, lbfgs, L2, inputs standardised
like ``StandardScaler``) on the training split (the DataModule's ``train_flat_dataloader`` if it has one, else
the first epoch's batches) and copied into torch buffers, so prediction, checkpoints and thresholds work as for
any detector; training stops after that first epoch's validation. MLPs train with Adam under
Lightning (and may use the IRM/DANN objective of the base class, off by default).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from datamodules.batch import TraceBatch
from datamodules.features import channel_index, select_by_prefix
from sift.detectors.module import DataSpec, DetectorModule, Standardizer, build_net, mlp
from sift.errors import SiftError

INPUT_KINDS = ("features", "pooled", "channel_mean", "prompt_pooled")


class InputSelector(nn.Module):
    """Maps a TraceBatch to the baseline's input matrix [B, k]."""

    def __init__(self, kind: str, *, prefixes: Sequence[str] = (), channel: str | None = None,
                 feature_names: Sequence[str] = (), channel_names: Sequence[str] = (), pooled_dim: int = 0) -> None:
        super().__init__()
        if kind not in INPUT_KINDS:
            raise SiftError(f"inputs must be one of {INPUT_KINDS}, got {kind!r}")
        self.kind = kind
        if kind == "features":
            idx = select_by_prefix(feature_names, prefixes)
            self.names = [feature_names[i] for i in idx]
        elif kind == "channel_mean":
            if channel is None:
                raise SiftError("inputs=channel_mean needs a channel name")
            idx = [channel_index(channel_names, channel)]
            self.names = [f"mean({channel})"]
        else:
            if pooled_dim <= 0:
                raise SiftError(f"inputs={kind} needs pooled_dim > 0 from the DataModule")
            idx = list(range(pooled_dim))
            self.names = [f"pooled/{i}" for i in idx]
        self.register_buffer("idx", torch.tensor(idx, dtype=torch.long), persistent=False)
        self.dim = len(idx)

    def forward(self, batch: TraceBatch) -> torch.Tensor:
        if self.kind == "features":
            return batch.features.index_select(-1, self.idx).float()
        if self.kind == "pooled":
            return batch.pooled.float()
        if self.kind == "prompt_pooled":
            pp = batch.prompt_pooled
            if pp is None or pp.shape[-1] != self.dim:
                raise SiftError("inputs=prompt_pooled: the batch has no prompt-final hidden states "
                                f"(got {None if pp is None else tuple(pp.shape)}, need [B, {self.dim}]); the "
                                "trajectories were extracted before they were stored: rerun sift-extract")
            return pp.float()
        x = batch.x.index_select(-1, self.idx).squeeze(-1)  # [B, T]
        m = batch.mask.to(x.dtype)
        return ((x * m).sum(1) / m.sum(1).clamp_min(1)).unsqueeze(-1)


#: the keys of a detector's ``inputs`` node
INPUT_KEYS = ("kind", "prefixes", "channel")


def _selector(inputs: str | Mapping[str, Any], **data: Any) -> InputSelector:
    """The detector's ``inputs`` node: ``kind`` (one of :data:`INPUT_KINDS`), ``prefixes`` (``features``: the
    feature-name prefixes kept; none: every feature), ``channel`` (``channel_mean``: the channel averaged). A bare
    string is the node of that kind with no further keys (e.g. ``inputs: pooled``)."""
    node = {"kind": inputs} if isinstance(inputs, str) else dict(inputs)
    unknown = sorted(set(node) - set(INPUT_KEYS))
    if unknown or "kind" not in node:
        raise SiftError(f"detector.inputs: unknown key(s) {unknown} (known: {list(INPUT_KEYS)})" if unknown
                        else f"detector.inputs: needs a kind (one of {INPUT_KINDS})")
    return InputSelector(str(node["kind"]), prefixes=list(node.get("prefixes") or ()), channel=node.get("channel"),
                         feature_names=data["feature_names"], channel_names=data["channel_names"],
                         pooled_dim=data["pooled_dim"])


class LogisticDetector(DetectorModule):
    """Logistic regression (scikit-learn, C given) on selected inputs, fitted once on the training data.

    The fit is convex and deterministic: every seed gives the same detector unless the training set itself
    changes with the seed (``detector.seed_resample``)."""

    #: trained in one pass (the training record counts it as converged)
    fits_once = True

    def __init__(self, *, data: DataSpec | Mapping[str, Any] | None = None, name: str = "logistic",
                 inputs: str | Mapping[str, Any] = "features", C: float = 1.0,
                 standardize: bool = True, max_iter: int = 1000, threshold_method: str = "youden") -> None:
        super().__init__(data=data, name=name, threshold_method=threshold_method)
        self.save_hyperparameters(logger=False)
        self.automatic_optimization = False
        self.selector = _selector(inputs, channel_names=self.channel_names,
                                  feature_names=self.feature_names, pooled_dim=self.pooled_dim)
        k = self.selector.dim
        self.C, self.standardize, self.max_iter = C, standardize, max_iter
        self.register_buffer("mean", torch.zeros(k))
        self.register_buffer("std", torch.ones(k))
        self.register_buffer("coef", torch.zeros(k))
        self.register_buffer("intercept", torch.zeros(()))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))
        self._X: list[torch.Tensor] = []
        self._y: list[torch.Tensor] = []

    def needs_input_stats(self) -> bool:
        return False

    def encode(self, batch: TraceBatch) -> tuple[torch.Tensor, torch.Tensor]:
        z = (self.selector(batch) - self.mean) / self.std
        return z @ self.coef + self.intercept, z

    def training_step(self, batch: TraceBatch | Sequence[TraceBatch], batch_idx: int) -> None:
        if bool(self.fitted):
            return None
        from sift.detectors.module import as_env_batches

        for b in as_env_batches(batch):
            self._X.append(self.selector(b).detach().cpu())
            self._y.append(b.label.detach().cpu())
        return None

    def fit_arrays(self, X: np.ndarray, y: np.ndarray) -> None:
        """Fit scaler + LogisticRegression on arrays and copy the solution into the buffers."""
        from sklearn.linear_model import LogisticRegression

        if len(np.unique(y)) < 2:
            raise SiftError(f"{self.detector_name}: training labels hold a single class")
        X = np.asarray(X, dtype=np.float64)
        mean = X.mean(0) if self.standardize else np.zeros(X.shape[1])
        std = X.std(0) if self.standardize else np.ones(X.shape[1])
        std = np.where(std < 1e-12, 1.0, std)
        lr = LogisticRegression(C=self.C, max_iter=self.max_iter)
        lr.fit((X - mean) / std, np.asarray(y).astype(int))
        dev = self.coef.device
        self.mean.copy_(torch.as_tensor(mean, dtype=torch.float32, device=dev))
        self.std.copy_(torch.as_tensor(std, dtype=torch.float32, device=dev))
        self.coef.copy_(torch.as_tensor(lr.coef_[0], dtype=torch.float32, device=dev))
        self.intercept.fill_(float(lr.intercept_[0]))
        self.fitted.fill_(True)

    def on_fit_start(self) -> None:
        """Fit from the DataModule's flat training loader when it has one (each trace once); otherwise the
        first epoch's training batches are collected and fitted before its validation."""
        dm = self.trainer.datamodule
        flat = getattr(dm, "train_flat_dataloader", None) if dm is not None else None
        if bool(self.fitted) or flat is None:
            return
        X, y = [], []
        for b in flat():
            X.append(self.selector(b).detach().cpu())
            y.append(b.label.detach().cpu())
        self.fit_arrays(torch.cat(X).numpy(), torch.cat(y).numpy())

    def _maybe_fit(self) -> None:
        if not bool(self.fitted) and self._X:
            self.fit_arrays(torch.cat(self._X).numpy(), torch.cat(self._y).numpy())
            self._X, self._y = [], []
        if bool(self.fitted) and self._trainer is not None:
            self.trainer.should_stop = True  # one pass over the data is all a convex fit needs

    def on_validation_epoch_start(self) -> None:
        if not self.trainer.sanity_checking:
            self._maybe_fit()

    def on_train_epoch_end(self) -> None:
        self._maybe_fit()


class MLPNet(nn.Module):
    """Linear → ReLU → Dropout (the representation, width ``hidden``) → Linear: (logits [B], representation)."""

    def __init__(self, in_dim: int, hidden: int = 128, dropout: float = 0.0) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Dropout(dropout))
        self.out = nn.Linear(hidden, 1)
        self.d_model = hidden

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.body(x)
        return self.out(z).squeeze(-1), z

    @staticmethod
    def stacked_forward(nets: Sequence[MLPNet], inputs: Sequence[tuple[torch.Tensor]],
                        generators: Sequence[torch.Generator] | None,
                        steps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """S nets on S batches of one size at once (stacked seeds, :mod:`sift.detectors.seed_stack`) →
        (logits [S, B], representation [S, B, hidden]); ``steps`` is unused (no step axis)."""
        from sift.detectors import seed_stack as st

        sizes = {x.shape for (x,) in inputs}
        if len(sizes) != 1:
            raise SiftError(f"stacked seeds: the seeds' batches differ in shape ({sorted(sizes)})")
        x = torch.stack([x for (x,) in inputs])
        z = torch.relu(st.linear(x, st.stacked([n.body[0] for n in nets], "weight"),
                                 st.stacked([n.body[0] for n in nets], "bias")))
        z = st.dropout(z, nets[0].body[2].p, generators)
        out = st.linear(z, st.stacked([n.out for n in nets], "weight"), st.stacked([n.out for n in nets], "bias"))
        return out.squeeze(-1), z


class MLPDetector(DetectorModule):
    """An MLP (``net``: :class:`MLPNet` keyword arguments) on standardised selected inputs, trained by the
    ``optimizer`` (default Adam) on the ``objective`` (environment-mean risk; IRM and DANN off by default)."""

    objective_defaults: ClassVar[dict[str, Any]] = {"env_reduction": "mean"}
    stack_net: ClassVar[type | None] = MLPNet

    def __init__(self, *, data: DataSpec | Mapping[str, Any] | None = None, name: str = "mlp",
                 inputs: str | Mapping[str, Any] = "features", net: Mapping[str, Any] | None = None,
                 standardize: bool = True,
                 optimizer: Mapping[str, Any] | None = None, scheduler: Mapping[str, Any] | None = None,
                 objective: Mapping[str, Any] | None = None, threshold_method: str = "youden") -> None:
        super().__init__(data=data, name=name, optimizer=optimizer, scheduler=scheduler, objective=objective,
                         threshold_method=threshold_method)
        self.save_hyperparameters(logger=False)
        self.selector = _selector(inputs, channel_names=self.channel_names,
                                  feature_names=self.feature_names, pooled_dim=self.pooled_dim)
        self.standardizer = Standardizer(self.selector.dim) if standardize else None
        self.net = build_net(net, MLPNet, in_dim=self.selector.dim)
        self.representation_dim = int(self.net.d_model)
        self.build_dann_head()

    def stack_inputs(self, batch: TraceBatch) -> tuple[torch.Tensor]:
        x = self.selector(batch)
        if self.standardizer is not None:
            x = self.standardizer(x)
        return (x,)

    def encode(self, batch: TraceBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(*self.stack_inputs(batch))

    def fit_input_stats(self, batches: Iterable[TraceBatch]) -> None:
        if self.standardizer is None:
            return
        for b in batches:
            self.standardizer.update(self.selector(b))
        self.standardizer.finalize()


__all__ = ["InputSelector", "LogisticDetector", "MLPDetector", "MLPNet", "mlp"]
