"""torchmetrics versions of the meta-faithfulness metrics, for evaluation during training (docs/design.md §7).

Each metric accumulates per-pair (or per-trace) verdicts over batches and reduces across DDP processes through
its states' ``dist_reduce_fx`` (counts are summed, per-pair records concatenated), so ``compute()`` gives the
same numbers on every rank as the functional metrics of :mod:`sift.metrics` on the gathered data.

* :class:`InvarianceViolationRate` — IVR per preserving axis and the macro mean (paper eq. 6).
* :class:`AlterationSensitivity` — AS over verified altering pairs (eq. 7).
* :class:`SelectiveGuaranteedRisk` — SGR threshold, coverage and bound from per-trace (ρ, correct) (eq. 35).
* :class:`MetaFaithfulness` — everything at once: IVR per axis, AS and MFS at full coverage, and, with the SGR
  threshold t* calibrated on the accumulated traces, the certified subset (pairs whose two traces both have
  ρ ≥ t*): IVR, AS, coverage κ and MFS = κ·2(1−IVR)·AS/((1−IVR)+AS) (eq. 8).

Verdicts are 0/1 (1 = judged faithful), labels the verified φ*. NaN marks an undefined value (no pairs, no
feasible SGR threshold); these metrics do not warn, unlike the functional ones. Every formula is the kernel of
:mod:`sift.metrics.invariance` (``ivr_update``/``ivr_compute``, ``as_update``/``as_compute``, ``mfs_compute``):
``update`` adds the kernel's counts to the states, ``compute`` applies the kernel to the reduced states.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from sift.errors import SiftError
from sift.metrics.invariance import as_compute, as_update, ivr_compute, ivr_update
from sift.metrics.operating import OperatingMetrics, OperatingPoint, PairArrays, operating_metrics
from sift.metrics.selective import DEFAULT_SGR

NAN = float("nan")


def _flat(x: Any, dtype: torch.dtype) -> torch.Tensor:
    return torch.as_tensor(x).detach().reshape(-1).to(dtype)


def _np(x: Any, dtype: torch.dtype) -> np.ndarray:
    return _flat(x, dtype).cpu().numpy()


def item_keys(items: Sequence[Any] | torch.Tensor) -> torch.Tensor:
    """Base items as int64 keys a metric state can hold and DDP can gather: integer tensors as they are, names
    by their 8-byte BLAKE2b hash (the same name gives the same key on every rank)."""
    import hashlib

    if isinstance(items, torch.Tensor):
        return items.detach().reshape(-1).long().cpu()
    return torch.tensor([int.from_bytes(hashlib.blake2b(str(x).encode(), digest_size=8).digest(), "little",
                                        signed=True) for x in items], dtype=torch.long)


def _certify(rho: np.ndarray, ok: np.ndarray, items: np.ndarray, alpha: float, delta: float,
             candidates: list[float] | None, bound: str, where: str):
    """SGR on gathered calibration traces (:meth:`sift.metrics.selective.SelectiveConfig.run`, as the report); the
    item bound needs the base item of every trace."""
    from sift.metrics.selective import ITEM_BOUNDS, SelectiveConfig

    if bound in ITEM_BOUNDS and items.size != rho.size:
        raise SiftError(f"{where}: the {bound!r} bound certifies over base items; pass the base item of every "
                        f"calibration trace (items=...), got {items.size} items for {rho.size} traces")
    cands = None if candidates is None else tuple(candidates)
    return SelectiveConfig(alpha, delta, bound, cands).run(rho, ok, items)


def _axis_ids(axes: Sequence[str], names: Sequence[str] | torch.Tensor, where: str) -> torch.Tensor:
    """Axis names (or already-mapped ids) → ids into ``axes``; an unknown name is an error."""
    if isinstance(names, torch.Tensor):
        return names.reshape(-1).long()
    lookup = {a: i for i, a in enumerate(axes)}
    bad = sorted({str(n) for n in names if str(n) not in lookup})
    if bad:
        raise SiftError(f"{where}: axes {bad} are not among the metric's axes {list(axes)}")
    return torch.tensor([lookup[str(n)] for n in names], dtype=torch.long)


class InvarianceViolationRate(Metric):
    """IVR per preserving axis (fixed list ``axes``) and their unweighted mean. States: per-axis counts (sum)."""

    full_state_update = False
    higher_is_better = False

    def __init__(self, axes: Sequence[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not axes or "mean" in axes:
            raise SiftError(f"axes must be a non-empty list without the reserved name 'mean', got {list(axes)}")
        self.axes = [str(a) for a in axes]
        self.add_state("n", torch.zeros(len(self.axes), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("violations", torch.zeros(len(self.axes), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, verdict_source: torch.Tensor, verdict_shifted: torch.Tensor,
               axis: Sequence[str] | torch.Tensor, mask: torch.Tensor | None = None) -> None:
        a, b = _np(verdict_source, torch.long), _np(verdict_shifted, torch.long)
        ids = _axis_ids(self.axes, axis, "InvarianceViolationRate").cpu().numpy()
        keep = None if mask is None else _np(mask, torch.bool)
        n, violations = ivr_update(a, b, ids, len(self.axes), keep)
        self.n += torch.as_tensor(n, dtype=torch.float64, device=self.n.device)
        self.violations += torch.as_tensor(violations, dtype=torch.float64, device=self.n.device)

    def compute(self) -> dict[str, torch.Tensor]:
        per, mean = ivr_compute(self.n.cpu().numpy(), self.violations.cpu().numpy())
        out = {a: torch.tensor(per[i]).float() for i, a in enumerate(self.axes)}
        out["mean"] = torch.tensor(mean).float()
        return out


class AlterationSensitivity(Metric):
    """AS = share of verified altering pairs whose verdict moves in the direction of the label change.
    Pairs whose labels do not change are not altering pairs and are left out (as in :mod:`sift.metrics`)."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("n", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("moved", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, verdict_before: torch.Tensor, verdict_after: torch.Tensor, label_before: torch.Tensor,
               label_after: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        n, moved = as_update(_np(verdict_before, torch.long), _np(verdict_after, torch.long),
                             _np(label_before, torch.long), _np(label_after, torch.long),
                             None if mask is None else _np(mask, torch.bool))
        self.n += n
        self.moved += moved

    def compute(self) -> torch.Tensor:
        return torch.tensor(as_compute(float(self.n), float(self.moved))).float()


class SelectiveGuaranteedRisk(Metric):
    """SGR (paper eq. 35 / App. K.5) on accumulated per-trace gate values ρ and correctness.

    ``compute()`` returns threshold t* (inf when infeasible), coverage, empirical selective risk, bound value
    and ``feasible`` (0/1), from :func:`sift.metrics.sgr` on the gathered traces. ``update`` takes the base item
    of every trace (names or integer ids), which the default bound (over base items) needs.
    """

    full_state_update = False

    def __init__(self, alpha: float | None = None, delta: float | None = None, bound: str | None = None,
                 candidates: Sequence[float] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        sel = DEFAULT_SGR  # None: the packaged default (configs/sgr/default.yaml)
        self.alpha = float(sel.alpha if alpha is None else alpha)
        self.delta = float(sel.delta if delta is None else delta)
        self.bound = str(sel.bound if bound is None else bound)
        self.candidates = None if candidates is None else [float(c) for c in candidates]
        self.add_state("rho", [], dist_reduce_fx="cat")
        self.add_state("correct", [], dist_reduce_fx="cat")
        self.add_state("item", [], dist_reduce_fx="cat")

    def update(self, rho: torch.Tensor, correct: torch.Tensor, items: Sequence[Any] | torch.Tensor | None = None
               ) -> None:
        self.rho.append(_flat(rho, torch.float64))
        self.correct.append(_flat(correct, torch.long).to(self.rho[-1].device))
        if items is not None:
            self.item.append(item_keys(items).to(self.rho[-1].device))

    def result(self):
        """The full :class:`sift.metrics.SGRResult` (curve included) on the gathered traces."""
        rho = dim_zero_cat(self.rho).cpu().numpy() if self.rho else np.zeros(0)
        ok = dim_zero_cat(self.correct).cpu().numpy() if self.correct else np.zeros(0, int)
        items = dim_zero_cat(self.item).cpu().numpy() if self.item else np.zeros(0, np.int64)
        return _certify(rho, ok, items, self.alpha, self.delta, self.candidates, self.bound,
                        "SelectiveGuaranteedRisk")

    def compute(self) -> dict[str, torch.Tensor]:
        r = self.result()
        return {"threshold": torch.tensor(r.threshold), "coverage": torch.tensor(r.coverage),
                "risk": torch.tensor(r.selective_risk), "bound": torch.tensor(r.bound_value),
                "feasible": torch.tensor(float(r.feasible))}


class MetaFaithfulness(Metric):
    """Per-pair records (cat states) + per-trace (ρ, correct) for SGR calibration → IVR/AS/MFS/coverage.

    ``update_pairs(...)`` takes a batch of verified pairs (axis names, kind ``preserving``/``altering``, the
    detector's verdicts and gate values on both traces, the verified labels); ``update_traces(rho, correct, items)``
    takes the calibration traces for SGR (e.g. the whole in-distribution validation split). ``compute()``:

    * ``ivr/<axis>``, ``ivr`` (macro mean over axes with pairs), ``as``, ``mfs`` — full coverage (κ = 1);
    * ``sgr_threshold`` t*, ``coverage`` κ = share of calibration traces with ρ ≥ t*, ``sgr_risk``,
      ``sgr_bound``, ``sgr_feasible``;
    * ``cert/ivr``, ``cert/as``, ``cert/mfs`` — on pairs whose two traces both have ρ ≥ t*, with κ in MFS
      (:mod:`sift.metrics.operating`, as every table): an infeasible SGR certifies nothing (κ = 0, IVR/AS NaN,
      MFS 0); NaN IVR/AS/MFS when no certified pair is left.
    """

    full_state_update = False
    higher_is_better = True
    KINDS = ("preserving", "altering")

    def __init__(self, axes: Sequence[str], alpha: float | None = None, delta: float | None = None,
                 bound: str | None = None, candidates: Sequence[float] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.axes = [str(a) for a in axes]
        if len(set(self.axes)) != len(self.axes) or "mean" in self.axes:
            raise SiftError(f"axes must be distinct and not 'mean', got {self.axes}")
        sel = DEFAULT_SGR  # None: the packaged default (configs/sgr/default.yaml)
        self.alpha = float(sel.alpha if alpha is None else alpha)
        self.delta = float(sel.delta if delta is None else delta)
        self.bound = str(sel.bound if bound is None else bound)
        self.candidates = None if candidates is None else [float(c) for c in candidates]
        for name in ("axis", "kind", "v_src", "v_dst", "y_src", "y_dst"):
            self.add_state(name, [], dist_reduce_fx="cat")
        for name in ("rho_src", "rho_dst", "trace_rho", "trace_correct", "trace_item"):
            self.add_state(name, [], dist_reduce_fx="cat")

    def update(self, pairs: dict[str, Any] | None = None, traces: tuple[Any, ...] | None = None) -> None:
        """``pairs``: keyword arguments of :meth:`update_pairs`; ``traces``: ``(rho, correct[, items])``. Use the two
        helpers; they go through this method so torchmetrics' update bookkeeping (cache, counts) applies."""
        if pairs is not None:
            self._add_pairs(**pairs)
        if traces is not None:
            self._add_traces(*traces)

    def update_pairs(self, axis: Sequence[str] | torch.Tensor, kind: Sequence[str] | torch.Tensor,
                     verdict_source: torch.Tensor, verdict_shifted: torch.Tensor, label_source: torch.Tensor,
                     label_shifted: torch.Tensor, rho_source: torch.Tensor | None = None,
                     rho_shifted: torch.Tensor | None = None) -> None:
        """Add a batch of verified pairs (ρ defaults to 1: every trace certified)."""
        self.update(pairs=dict(axis=axis, kind=kind, verdict_source=verdict_source, verdict_shifted=verdict_shifted,
                               label_source=label_source, label_shifted=label_shifted, rho_source=rho_source,
                               rho_shifted=rho_shifted))

    def update_traces(self, rho: torch.Tensor, correct: torch.Tensor,
                      items: Sequence[Any] | torch.Tensor | None = None) -> None:
        """Add calibration traces for SGR: gate ρ, 1[verdict == φ*] and the base item of each (names or integer
        ids; the default bound certifies over base items and needs them)."""
        self.update(traces=(rho, correct, items))

    def _add_pairs(self, axis: Sequence[str] | torch.Tensor, kind: Sequence[str] | torch.Tensor,
                   verdict_source: torch.Tensor, verdict_shifted: torch.Tensor, label_source: torch.Tensor,
                   label_shifted: torch.Tensor, rho_source: torch.Tensor | None = None,
                   rho_shifted: torch.Tensor | None = None) -> None:
        vs = _flat(verdict_source, torch.long)
        dev = vs.device
        n = vs.numel()
        if isinstance(kind, torch.Tensor):
            k = kind.reshape(-1).long()
        else:
            bad = sorted({str(x) for x in kind} - set(self.KINDS))
            if bad:
                raise SiftError(f"MetaFaithfulness: unknown pair kinds {bad} (expected {self.KINDS})")
            k = torch.tensor([self.KINDS.index(str(x)) for x in kind], dtype=torch.long)
        ax = torch.tensor([self.axes.index(str(a)) if str(a) in self.axes else -1 for a in axis], dtype=torch.long) \
            if not isinstance(axis, torch.Tensor) else axis.reshape(-1).long()
        unknown = (ax < 0) & (k == 0)
        if unknown.any():
            names = sorted({str(a) for a, u in zip(axis, unknown.tolist()) if u})
            raise SiftError(f"MetaFaithfulness: preserving axes {names} are not among {self.axes}")
        ones = torch.ones(n, dtype=torch.float64, device=dev)
        parts = {"axis": ax.to(dev), "kind": k.to(dev), "v_src": vs, "v_dst": _flat(verdict_shifted, torch.long),
                 "y_src": _flat(label_source, torch.long), "y_dst": _flat(label_shifted, torch.long),
                 "rho_src": ones if rho_source is None else _flat(rho_source, torch.float64),
                 "rho_dst": ones if rho_shifted is None else _flat(rho_shifted, torch.float64)}
        for name, t in parts.items():
            if t.numel() != n:
                raise SiftError(f"MetaFaithfulness: {name} has {t.numel()} entries, expected {n}")
            getattr(self, name).append(t.to(dev))

    def _add_traces(self, rho: torch.Tensor, correct: torch.Tensor,
                    items: Sequence[Any] | torch.Tensor | None = None) -> None:
        r = _flat(rho, torch.float64)
        self.trace_rho.append(r)
        self.trace_correct.append(_flat(correct, torch.long).to(r.device))
        if items is not None:
            self.trace_item.append(item_keys(items).to(r.device))

    def _cat(self, name: str, dtype) -> np.ndarray:
        v = getattr(self, name)
        if isinstance(v, list):
            return torch.cat(v).cpu().numpy() if v else np.zeros(0, dtype=dtype)
        return dim_zero_cat(v).cpu().numpy()

    def compute(self) -> dict[str, torch.Tensor]:
        ax, kind = self._cat("axis", int), self._cat("kind", int)
        vs, vd, ys, yd = (self._cat(n, int) for n in ("v_src", "v_dst", "y_src", "y_dst"))
        rs, rd = self._cat("rho_src", float), self._cat("rho_dst", float)
        tr, tc = self._cat("trace_rho", float), self._cat("trace_correct", int)
        ti = self._cat("trace_item", np.int64)

        # every pair's two traces as rows of per-trace arrays, for the operating-point kernel
        n = len(vs)
        verdict, rho, rows = np.concatenate([vs, vd]), np.concatenate([rs, rd]), np.arange(n)
        pres, alt = rows[kind == 0], rows[kind == 1]
        preserving = PairArrays(pres, n + pres, axis=ax[pres])
        altering = PairArrays(alt, n + alt, label_src=ys[alt], label_dst=yd[alt])

        def at(point: OperatingPoint) -> OperatingMetrics:
            return operating_metrics(point, tr, verdict, rho, preserving, altering, len(self.axes))

        out: dict[str, float] = {}
        full = at(OperatingPoint.full())
        out.update({f"ivr/{a}": float(v) for a, v in zip(self.axes, full.ivr_axes)})
        out.update({"ivr": full.ivr, "as": full.as_, "mfs": full.mfs})
        r = _certify(tr, tc, ti, self.alpha, self.delta, self.candidates, self.bound, "MetaFaithfulness")
        cert = at(OperatingPoint.sgr(r.threshold, r.feasible))  # infeasible: κ = 0, MFS 0 (the report's rule)
        out.update({"sgr_threshold": r.threshold, "coverage": cert.coverage if tr.size else NAN,
                    "sgr_risk": r.selective_risk, "sgr_bound": r.bound_value, "sgr_feasible": float(r.feasible),
                    "cert/ivr": cert.ivr, "cert/as": cert.as_, "cert/mfs": cert.mfs})
        return {k: torch.tensor(v, dtype=torch.float32) for k, v in out.items()}
