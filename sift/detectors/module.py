"""The LightningModule contract every detector shares (SIFT, the five baselines, ensembles).

* A detector is configured as in lightning-hydra-template: its architecture (``net``, in the subclass), its
  ``optimizer`` (a ``_partial_`` config, default Adam), its learning-rate ``scheduler`` and its ``objective``
  (:class:`~sift.detectors.objective.Objective`); the three are plain mappings, saved in the checkpoint.
* ``training_step`` takes one :class:`TraceBatch` or a list of per-environment TraceBatches; the objective is
  Σ_e R_e (``env_reduction="sum"``, paper eq. 14; ``"mean"`` is DomainBed's) + λ_IRM Ω_IRM + λ_DANN Ω_DANN,
  where the penalties are optional for any torch detector (on for SIFT). A single batch is split by ``env``.
* validation/test/predict take one TraceBatch. During ``fit``, each validation epoch freezes the decision
  threshold on the in-distribution validation loader (dataloader 0) into the ``threshold`` buffer, so the
  checkpoint saved after that epoch carries it; ``validate``/``test`` outside ``fit`` never retune it.
* ``predict_step`` returns probabilities, verdicts at the frozen threshold and the gate ρ = max(s, 1−s).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import CatMetric, MaxMetric, MeanMetric
from torchmetrics.classification import BinaryAUROC
from torchmetrics.utilities import dim_zero_cat

from datamodules.batch import TraceBatch
from sift.detectors.objective import Objective, build_optimizer, optimizer_config
from sift.detectors.penalties import DomainClassifier, dann_penalty, irm_penalty
from sift.detectors.schedule import LRSchedule
from sift.detectors.thresholds import confidence_gate, fit_threshold
from sift.errors import SiftError

_TENSOR_FIELDS = ("x", "mask", "label", "env", "domain", "model", "pooled", "features")


# --------------------------------------------------------------------------------------------- batches
def _subset(b: TraceBatch, idx: torch.Tensor) -> TraceBatch:
    t = {k: getattr(b, k)[idx] for k in _TENSOR_FIELDS}
    il = idx.tolist()
    opt = {k: getattr(b, k)[idx] if getattr(b, k) is not None else None
           for k in ("prompt_pooled", "token_ids", "token_segment", "states")}
    return TraceBatch(**t, trace_id=[b.trace_id[i] for i in il] if b.trace_id else [],
                      base_item=[b.base_item[i] for i in il] if b.base_item else [],
                      text=[b.text[i] for i in il] if b.text else [], **opt)


def as_env_batches(batch: TraceBatch | Sequence[TraceBatch]) -> list[TraceBatch]:
    """A list of per-environment batches: a list/tuple passes through (empty ones dropped); a single
    batch is split by its ``env`` ids (ascending)."""
    if isinstance(batch, TraceBatch):
        envs = torch.unique(batch.env)
        if len(envs) <= 1:
            return [batch]
        return [_subset(batch, torch.nonzero(batch.env == e).squeeze(1)) for e in envs]
    if isinstance(batch, dict):  # CombinedLoader over a dict of per-env loaders
        batch = list(batch.values())
    out = [b for b in batch if b is not None and len(b) > 0]
    if not out:
        raise SiftError("training batch holds no examples")
    return out


def concat_batches(batches: Sequence[TraceBatch]) -> TraceBatch:
    """Concatenate batches along B, right-padding ``x``/``mask`` to the longest T."""
    if len(batches) == 1:
        return batches[0]
    T = max(b.x.shape[1] for b in batches)
    xs, ms = [], []
    for b in batches:
        pad = T - b.x.shape[1]
        xs.append(F.pad(b.x, (0, 0, 0, pad)))
        ms.append(F.pad(b.mask, (0, pad), value=False))
    t = {k: torch.cat([getattr(b, k) for b in batches]) for k in _TENSOR_FIELDS if k not in ("x", "mask")}
    pp = [b.prompt_pooled for b in batches]
    tok_ids, tok_seg = None, None
    if all(b.token_ids is not None and b.token_segment is not None for b in batches):
        from datamodules.token_steps import pad_token_steps

        tok_ids, tok_seg = pad_token_steps([b.token_ids for b in batches], [b.token_segment for b in batches])
    st = [b.states for b in batches]
    states = torch.cat([F.pad(s, (0, 0, 0, T - s.shape[1])) for s in st]) if all(s is not None for s in st) else None
    return TraceBatch(x=torch.cat(xs), mask=torch.cat(ms), **t, states=states,
                      trace_id=[i for b in batches for i in b.trace_id],
                      base_item=[i for b in batches for i in b.base_item],
                      prompt_pooled=torch.cat(pp) if all(p is not None for p in pp) else None,
                      text=[i for b in batches for i in b.text] if all(b.text for b in batches) else [],
                      token_ids=tok_ids, token_segment=tok_seg)


# --------------------------------------------------------------------------------------------- data spec
@dataclass
class DataSpec:
    """What a detector needs to know about the data to build itself: every detector takes it as ``data`` (a
    DataSpec or its :meth:`as_dict`, which is what the checkpoint's hyperparameters hold)."""

    channel_names: list[str] = field(default_factory=list)
    feature_names: list[str] = field(default_factory=list)
    pooled_dim: int = 0
    n_envs: int = 1
    n_domains: int = 1
    n_models: int = 1
    env_names: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Plain values only (a checkpoint loaded with ``weights_only=True`` can hold them)."""
        return asdict(self)

    @classmethod
    def of(cls, data: DataSpec | Mapping[str, Any] | None) -> DataSpec:
        """``data`` as a DataSpec (None: no channels, features or states; one environment, domain and model)."""
        if data is None:
            return cls()
        if isinstance(data, DataSpec):
            return data
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise SiftError(f"detector data: unknown key(s) {unknown} (known: {sorted(cls.__dataclass_fields__)})")
        d = dict(data)
        return cls(**{**d, **{k: list(d[k]) for k in ("channel_names", "feature_names", "env_names") if k in d}})

    @classmethod
    def from_datamodule(cls, dm: Any, scan_batches: int = 10_000) -> DataSpec:
        """Read ``channel_names``/``feature_names`` (required) and ``pooled_dim``, ``env_names`` (or
        ``n_envs``), ``domain_names`` (or ``n_domains``), ``model_names`` (or ``n_models``) when the DataModule
        has them; anything missing is inferred by scanning its training loader."""
        for a in ("channel_names", "feature_names"):
            if not hasattr(dm, a):
                raise SiftError(f"the DataModule {type(dm).__name__} has no attribute {a!r} (batch contract)")

        def count(names: str, n: str) -> int | None:
            if getattr(dm, names, None) is not None:
                return len(getattr(dm, names))
            return getattr(dm, n, None)

        pooled_dim = getattr(dm, "pooled_dim", None)
        n_env, n_dom, n_mod = count("env_names", "n_envs"), count("domain_names", "n_domains"), count(
            "model_names", "n_models")
        if None in (pooled_dim, n_env, n_dom, n_mod):
            mx = {"env": -1, "domain": -1, "model": -1}
            for i, batch in enumerate(dm.train_dataloader()):
                for b in as_env_batches(batch):
                    pooled_dim = pooled_dim if pooled_dim is not None else int(b.pooled.shape[-1])
                    for k in mx:
                        mx[k] = max(mx[k], int(getattr(b, k).max()))
                if i + 1 >= scan_batches:
                    break
            n_env = n_env if n_env is not None else mx["env"] + 1
            n_dom = n_dom if n_dom is not None else mx["domain"] + 1
            n_mod = n_mod if n_mod is not None else mx["model"] + 1
        return cls(channel_names=list(dm.channel_names), feature_names=list(dm.feature_names),
                   pooled_dim=int(pooled_dim), n_envs=int(n_env), n_domains=int(n_dom), n_models=int(n_mod),
                   env_names=list(getattr(dm, "env_names", None) or []))


# --------------------------------------------------------------------------------------------- helpers
class Standardizer(nn.Module):
    """Per-column standardisation with statistics fitted once on training data (saved in the checkpoint)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("std", torch.ones(dim))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))
        self._acc: list[torch.Tensor] = []

    def update(self, rows: torch.Tensor) -> None:
        """Accumulate rows [N, dim]."""
        r = rows.detach().double().reshape(-1, rows.shape[-1])
        self._acc.append(torch.stack([r.sum(0), (r * r).sum(0), torch.full_like(r[0], r.shape[0])]))

    def finalize(self) -> None:
        if not self._acc:
            return
        s, ss, n = torch.stack(self._acc).sum(0)
        n = n.clamp_min(1)
        mean = s / n
        var = (ss / n - mean * mean).clamp_min(0)
        self.mean.copy_(mean.float())
        self.std.copy_(var.sqrt().clamp_min(1e-6).float())
        self.fitted.fill_(True)
        self._acc = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def mlp(in_dim: int, hidden: int, out_dim: int = 1, dropout: float = 0.0) -> nn.Sequential:
    """Two-layer MLP: Linear → ReLU → Dropout → Linear."""
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, out_dim))


def n_parameters(module: nn.Module, trainable_only: bool = True) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def build_net(net: Mapping[str, Any] | None, default: type[nn.Module], **inputs: Any) -> nn.Module:
    """The architecture of a ``detector.net`` config: its ``_target_`` (default ``default``) called with the
    config's keys and the data-dependent ``inputs`` (e.g. the input width). Built inside the detector's
    ``__init__``, so its parameters draw from the RNG in the same order as when the detector built it itself."""
    from hydra.utils import get_class

    cfg = dict(net or {})
    cfg.pop("_partial_", None)
    target = cfg.pop("_target_", None)
    cls = get_class(target) if target else default
    return cls(**inputs, **cfg)


# --------------------------------------------------------------------------------------------- base module
def ramp_factor(step: int, start: int, ramp: int) -> float:
    """0 before ``start``, then linear from 0 to 1 over ``ramp`` steps (1 at once when ``ramp`` is 0)."""
    if step < start:
        return 0.0
    return 1.0 if ramp <= 0 else min(1.0, (step - start) / ramp)


class DetectorModule(pl.LightningModule):
    """Base class. Subclasses implement :meth:`encode` (logits [B] and a representation [B, d] or None) and
    may override :meth:`fit_input_stats`; they call ``self.save_hyperparameters()`` in their ``__init__``.

    ``optimizer``: a ``_partial_`` optimizer config (default :data:`~sift.detectors.objective.DEFAULT_OPTIMIZER`,
    Adam); ``scheduler``: :class:`~sift.detectors.schedule.LRSchedule` fields; ``objective``:
    :class:`~sift.detectors.objective.Objective` fields over the class's :attr:`objective_defaults`."""

    #: width of the representation ``encode`` returns (needed for DANN); set by subclasses.
    representation_dim: int | None = None
    #: the objective a detector class trains with when its config leaves a term unset
    objective_defaults: ClassVar[dict[str, Any]] = {}
    #: input statistics (standardisation) are fitted on at most this many training batches
    stats_max_batches: ClassVar[int] = 200

    def __init__(self, *, data: DataSpec | Mapping[str, Any] | None = None, name: str = "detector",
                 optimizer: Mapping[str, Any] | None = None, scheduler: Mapping[str, Any] | None = None,
                 objective: Mapping[str, Any] | None = None, threshold_method: str = "youden") -> None:
        super().__init__()
        self.optimizer_config = optimizer_config(optimizer)
        self.lr_schedule = LRSchedule.build_from(scheduler)
        self.objective = Objective.build(self.objective_defaults, objective)
        self.detector_name = name
        spec = DataSpec.of(data)
        self.channel_names, self.feature_names = list(spec.channel_names), list(spec.feature_names)
        self.pooled_dim = int(spec.pooled_dim)
        self.n_classes = {"env": int(spec.n_envs), "domain": int(spec.n_domains), "model": int(spec.n_models)}
        self.threshold_method = threshold_method
        self.domain_classifier: DomainClassifier | None = None
        self.register_buffer("threshold", torch.tensor(0.5))
        self.val_loss, self.val_auroc, self.val_auroc_best = MeanMetric(), BinaryAUROC(), MaxMetric()
        self.val_probs, self.val_labels = CatMetric(), CatMetric()
        self.test_loss, self.test_auroc = MeanMetric(), BinaryAUROC()
        self.test_probs, self.test_labels = CatMetric(), CatMetric()

    def save_hyperparameters(self, *args: Any, ignore: Sequence[str] | str | None = None, frame: Any = None,
                             logger: bool = True) -> None:
        """Lightning's, from the calling ``__init__``; a :class:`DataSpec` given as ``data`` is kept as its
        :meth:`~DataSpec.as_dict` (plain values, so the checkpoint loads with ``weights_only=True``)."""
        import inspect

        frame = frame if frame is not None else inspect.currentframe().f_back  # type: ignore[union-attr]
        super().save_hyperparameters(*args, ignore=ignore, frame=frame, logger=logger)
        if isinstance(self.hparams.get("data"), DataSpec):
            self.hparams["data"] = self.hparams["data"].as_dict()

    # ---- subclass API
    def encode(self, batch: TraceBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [B] (positive = faithful) and the pooled representation [B, d] (or None)."""
        raise NotImplementedError

    def fit_input_stats(self, batches: Iterable[TraceBatch]) -> None:
        """Fit input statistics from training batches (called once before training). Default: nothing."""

    def needs_input_stats(self) -> bool:
        return any(isinstance(m, Standardizer) and not bool(m.fitted) for m in self.modules())

    def build_dann_head(self) -> None:
        """Create the domain classifier when ``objective.use_dann`` (subclasses call this after setting
        ``representation_dim``)."""
        if not self.objective.use_dann:
            return
        if not self.representation_dim:
            raise SiftError(f"{type(self).__name__} has no representation for DANN")
        self.domain_classifier = DomainClassifier(self.representation_dim,
                                                  self.n_classes[self.objective.dann_domain],
                                                  hidden=self.objective.dann_hidden)

    # ---- inference
    def forward(self, batch: TraceBatch) -> torch.Tensor:
        """P(faithful) per trace."""
        return torch.sigmoid(self.encode(batch)[0])

    def probs(self, batch: TraceBatch) -> torch.Tensor:
        return self(batch)

    def predict_step(self, batch: TraceBatch, batch_idx: int = 0, dataloader_idx: int = 0) -> dict[str, Any]:
        p = self.probs(batch)
        return {"prob": p, "verdict": (p >= self.threshold).long(), "rho": confidence_gate(p),
                "label": batch.label, "env": batch.env, "domain": batch.domain, "model": batch.model,
                "trace_id": list(batch.trace_id), "base_item": list(batch.base_item)}

    @torch.no_grad()
    def predict_loader(self, loader: Iterable[TraceBatch]) -> dict[str, Any]:
        """Run :meth:`predict_step` over a loader without a Trainer; tensors are concatenated on CPU."""
        was = self.training
        self.eval()
        outs = [self.predict_step(b.to(self.device), i) for i, b in enumerate(loader)]
        self.train(was)
        return merge_predictions(outs)

    # ---- training
    def _domain_ids(self, b: TraceBatch) -> torch.Tensor:
        return getattr(b, self.objective.dann_domain)

    def training_step(self, batch: TraceBatch | Sequence[TraceBatch], batch_idx: int) -> torch.Tensor:
        if self._seed_stack is not None:  # one seed of a stacked group: the group computes every seed's step at once
            loss, terms, bs = self._seed_stack.step(self, batch)
        else:
            envs = as_env_batches(batch)
            cat = concat_batches(envs)
            logits, z = self.encode(cat)
            loss, terms = self.objective_loss(logits, z, cat, [len(b) for b in envs])
            bs = len(cat)
        for k, v in terms.items():
            self.log(k, v, on_step=False, on_epoch=True, prog_bar=k == "train/loss", batch_size=bs)
        return loss

    def objective_loss(self, logits: torch.Tensor, z: torch.Tensor | None, cat: TraceBatch,
                       sizes: Sequence[int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The training objective on one step's batch (``cat``: the environments' batches concatenated, ``sizes``
        their lengths): Σ_e R_e (or the mean) + λ_IRM Ω_IRM + λ_DANN Ω_DANN; returns the loss and the logged
        terms (detached)."""
        y = cat.label.float()
        risks = torch.stack([F.binary_cross_entropy_with_logits(l, t) for l, t in
                             zip(logits.split(list(sizes)), y.split(list(sizes)))])
        obj = self.objective
        reduce = torch.sum if obj.env_reduction == "sum" else torch.mean
        risk = reduce(risks)
        loss = risk
        terms = {"train/risk": risk.detach()}
        if obj.use_irm:
            pen = reduce(torch.stack([irm_penalty(l, t) for l, t in zip(logits.split(list(sizes)),
                                                                         y.split(list(sizes)))]))
            w = obj.irm_lambda if self.global_step >= obj.irm_anneal_steps else 1.0
            loss = loss + self.penalty_ramp() * w * pen
            terms["train/irm_penalty"] = pen.detach()
        if obj.use_dann:
            assert self.domain_classifier is not None and z is not None
            self.domain_classifier.grl.alpha = self._grl_alpha()
            dl = dann_penalty(self.domain_classifier, z, self._domain_ids(cat))
            loss = loss + self.penalty_ramp() * obj.dann_weight * dl
            terms["train/dann_loss"] = dl.detach()
        terms["train/loss"] = loss.detach()
        return loss, terms

    # ---- stacked seeds (sift/detectors/seed_stack.py)
    #: the stacked group this module trains in (set for the length of a stacked fit), else None
    _seed_stack: Any = None
    #: the net class this detector builds when its config names none, if the detector trains stacked (it then
    #: implements :meth:`stack_inputs`); None: it trains alone
    stack_net: ClassVar[type | None] = None

    def stack_inputs(self, batch: TraceBatch) -> tuple[torch.Tensor, ...] | None:
        """The inputs of ``self.net`` for ``batch`` (what :meth:`encode` feeds it), when the net can train
        stacked with other seeds (its class has ``stacked_forward``); None: this detector trains alone."""
        return None

    def penalty_ramp(self) -> float:
        """Factor on both invariance penalties (IRM, DANN) at the current step: 0 for the first
        ``penalty_start_steps`` (the encoder learns the task by ERM first), then rising linearly to 1 over
        ``penalty_ramp_steps``. DomainBed's IRM anneal (``irm_anneal_steps``) is the same idea for IRM alone.
        Measured on organism v2 (issue 12): with the full penalties from step 0, SIFT's validation AUROC stalled
        near 0.6 for 100+ steps and 2 of 4 seeds early-stopped there; ERM alone converged on every seed tried."""
        return ramp_factor(int(self.global_step), self.objective.penalty_start_steps,
                           self.objective.penalty_ramp_steps)

    def _grl_alpha(self) -> float:
        """Gradient-reversal coefficient: 1, or Ganin et al.'s ramp 2/(1+exp(−10p)) − 1 over training progress p."""
        if self.objective.dann_schedule == "constant" or self._trainer is None:
            return 1.0
        total = max(1, int(self.trainer.estimated_stepping_batches))
        p = min(1.0, self.global_step / total)
        return float(2.0 / (1.0 + math.exp(-10.0 * p)) - 1.0)

    def configure_optimizers(self):
        """The ``optimizer`` partial on two parameter groups: the detector's, and the domain classifier's at
        ``objective.dann_lr_mult`` times the learning rate; the ``scheduler`` steps every optimizer step."""
        head = set(map(id, self.domain_classifier.parameters())) if self.domain_classifier is not None else set()
        main = [p for p in self.parameters() if p.requires_grad and id(p) not in head]
        groups = [{"params": main}] if main else []
        if head:
            groups.append({"params": list(self.domain_classifier.parameters())})
        if not groups:
            return None
        opt = build_optimizer(self.optimizer_config, groups)
        if head:
            opt.param_groups[-1]["lr"] = opt.defaults["lr"] * self.objective.dann_lr_mult
        if self.lr_schedule.constant:
            return opt
        total = int(self.trainer.estimated_stepping_batches) if self._trainer is not None else 1
        sched = self.lr_schedule.build(opt, total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}

    def on_fit_start(self) -> None:
        if not self.needs_input_stats():
            return
        loader = _train_loader(self.trainer)
        if loader is None:
            raise SiftError("cannot fit input statistics: no training loader found")

        def gen() -> Iterator[TraceBatch]:
            for i, batch in enumerate(loader):
                if i >= self.stats_max_batches:
                    break
                for b in as_env_batches(batch):
                    yield b.to(self.device)

        self.fit_input_stats(gen())

    def on_train_start(self) -> None:
        for m in (self.val_loss, self.val_auroc, self.val_probs, self.val_labels):
            m.reset()
        # a detector fitted in one pass (fits_once) that resumes after its fitting epoch has nothing left to do:
        # it stops where the uninterrupted run stopped, so the record's stop epoch survives the resume
        if getattr(self, "fits_once", False) and bool(getattr(self, "fitted", False)) \
                and self.trainer.fit_loop.epoch_progress.current.completed > 0:
            self.trainer.should_stop = True

    # ---- evaluation
    def _eval_step(self, batch: TraceBatch, stage: str) -> None:
        p = self.probs(batch).clamp(1e-7, 1 - 1e-7)
        y = batch.label.float()
        loss = F.binary_cross_entropy(p, y)
        getattr(self, f"{stage}_loss").update(loss, weight=len(batch))
        getattr(self, f"{stage}_auroc").update(p, y.long())
        getattr(self, f"{stage}_probs").update(p)
        getattr(self, f"{stage}_labels").update(y)

    def validation_step(self, batch: TraceBatch, batch_idx: int, dataloader_idx: int = 0) -> None:
        if dataloader_idx == 0:  # the in-distribution validation loader
            self._eval_step(batch, "val")

    def test_step(self, batch: TraceBatch, batch_idx: int, dataloader_idx: int = 0) -> None:
        if dataloader_idx == 0:
            self._eval_step(batch, "test")

    def _epoch_end(self, stage: str) -> None:
        probs = dim_zero_cat(getattr(self, f"{stage}_probs").compute()) if getattr(
            self, f"{stage}_probs").update_count else torch.empty(0)
        labels = dim_zero_cat(getattr(self, f"{stage}_labels").compute()) if getattr(
            self, f"{stage}_labels").update_count else torch.empty(0)
        if probs.numel() == 0:
            return
        trainer = self._trainer
        fitting = trainer is not None and trainer.state.fn == "fit" and not trainer.sanity_checking
        if stage == "val" and fitting:
            self.threshold.fill_(fit_threshold(probs.cpu().numpy(), labels.cpu().numpy(), self.threshold_method))
        m = binary_metrics(probs, labels, float(self.threshold))
        auroc = getattr(self, f"{stage}_auroc")
        m["auroc"] = auroc.compute() if 0 < labels.sum() < labels.numel() else torch.tensor(float("nan"))
        m["loss"] = getattr(self, f"{stage}_loss").compute()
        m["threshold"] = self.threshold.clone()
        for k, v in m.items():
            self.log(f"{stage}/{k}", torch.as_tensor(v, dtype=torch.float32), prog_bar=k == "auroc")
        if stage == "val" and fitting and not torch.isnan(m["auroc"]):
            self.val_auroc_best.update(m["auroc"])
            self.log("val/auroc_best", self.val_auroc_best.compute())
        for s in ("loss", "auroc", "probs", "labels"):
            getattr(self, f"{stage}_{s}").reset()

    def on_validation_epoch_end(self) -> None:
        self._epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._epoch_end("test")

    @torch.no_grad()
    def freeze_threshold(self, val_loader: Iterable[TraceBatch]) -> float:
        """Freeze the threshold on an in-distribution validation loader explicitly (e.g. for ensembles)."""
        out = self.predict_loader(val_loader)
        t = fit_threshold(out["prob"].numpy(), out["label"].numpy(), self.threshold_method)
        self.threshold.fill_(t)
        return t

    # ---- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        cls = type(self)
        checkpoint["sift_detector"] = {"class": f"{cls.__module__}.{cls.__qualname__}",
                                       "name": self.detector_name, "threshold": float(self.threshold)}
        # the running best validation AUROC is a metric state (not in state_dict): carried so a resumed run
        # logs the same val/auroc_best as an uninterrupted one
        if self.val_auroc_best.update_count:
            checkpoint["sift_val_auroc_best"] = self.val_auroc_best.compute().detach().cpu().float()
        if self._seed_stack is not None:  # a stacked seed's dropout stream: a resumed group continues it exactly
            checkpoint["sift_stack_dropout_rng"] = self._seed_stack.generator_of(self).get_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        best = checkpoint.get("sift_val_auroc_best")
        if isinstance(best, torch.Tensor) and torch.isfinite(best):
            self.val_auroc_best.reset()
            self.val_auroc_best.update(best.to(self.val_auroc_best.max_value.device))
        rng = checkpoint.get("sift_stack_dropout_rng")
        if self._seed_stack is not None and isinstance(rng, torch.Tensor):
            self._seed_stack.generator_of(self).set_state(rng)


def binary_metrics(probs: torch.Tensor, labels: torch.Tensor, threshold: float) -> dict[str, torch.Tensor]:
    """Accuracy, balanced accuracy and coverage-free verdict rates at ``threshold``."""
    pred = (probs >= threshold).float()
    y = labels.float()
    acc = (pred == y).float().mean()
    tpr = (pred[y == 1] == 1).float().mean() if (y == 1).any() else torch.tensor(float("nan"))
    tnr = (pred[y == 0] == 0).float().mean() if (y == 0).any() else torch.tensor(float("nan"))
    return {"acc": acc, "balanced_acc": (tpr + tnr) / 2, "rho_mean": confidence_gate(probs).mean()}


def merge_predictions(outs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate per-batch ``predict_step`` outputs (tensors on CPU, lists flattened)."""
    if not outs:
        return {}
    res: dict[str, Any] = {}
    for k, v in outs[0].items():
        if isinstance(v, torch.Tensor):
            res[k] = torch.cat([o[k].detach().cpu().reshape(-1) for o in outs])
        else:
            res[k] = [x for o in outs for x in o[k]]
    return res


def _train_loader(trainer: pl.Trainer) -> Any:
    if trainer.datamodule is not None:
        return trainer.datamodule.train_dataloader()
    try:  # loaders passed to fit() directly
        return trainer.fit_loop._data_source.dataloader()
    except Exception:  # pragma: no cover - Lightning internals
        return None


def load_detector(path: str, map_location: str | torch.device = "cpu", trusted: Sequence[str] = (),
                  **kwargs: Any) -> DetectorModule:
    """Load any detector checkpoint written by sift (its class is recorded in the checkpoint).

    The file is read as data (``weights_only=True``); only :class:`DetectorModule` subclasses are built, from
    sift's own modules or a class named in ``trusted`` (the ``_target_`` of the run's detector config)."""
    from sift.checkpoints import load_checkpoint

    ckpt = load_checkpoint(path, map_location=map_location, what="detector checkpoint")
    info = ckpt.get("sift_detector")
    if not isinstance(info, dict) or not isinstance(info.get("class"), str):
        raise SiftError(f"{path}: not a sift detector checkpoint (no 'sift_detector' entry)")
    mod, _, name = info["class"].rpartition(".")
    try:
        ours = mod.split(".")[0] in ("sift", "datamodules") or info["class"] in trusted
        cls = getattr(importlib.import_module(mod), name) if ours else None
    except (ImportError, AttributeError):
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, DetectorModule)):
        raise SiftError(f"{path}: sift_detector.class {info['class']!r} is not a sift detector class")
    try:
        return cls.load_from_checkpoint(path, map_location=map_location, weights_only=True, **kwargs)
    except (KeyError, RuntimeError, TypeError, ValueError) as e:
        raise SiftError(f"{path}: detector checkpoint does not fit {name} ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:160] if str(e) else ''})") from None
