"""One detector run's per-trace predictions on one split: the input of every analysis.

A :class:`Predictions` table is what a trained detector (one seed, or an ensemble) says about every trace of
a split of the trajectory DataModule, next to the trace's verified label and metadata. Pairs refer to traces
by ``trace_id``. Tables are stored as ``.npz`` (atomic) so analyses rerun without the models.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from sift.atomic import atomic_open
from sift.errors import SiftError
from sift.metrics.selective import gate

_ARRAYS = ("trace_id", "base_item", "domain", "model", "condition", "label", "prob")


#: ``Predictions.meta`` key of a seed ensemble's run spec: the detector whose seeds it averages
ENSEMBLE_OF = "ensemble_of"


@dataclass(frozen=True)
class RunRole:
    """What a run is in the report, read in this one place from the ``meta`` keys its run spec wrote
    (:func:`sift.evaluation.faithshift_report.load_predictions`, ``sift-evaluate``): an ablation (Table 4), a
    factorial variant, a main-table transfer column, a transfer run's own in-distribution test, or a
    transfer-matrix cell. A run with none of these is a main run."""

    ablation: str | None = None  #: the SIFT ablation it was trained with ("none" and "" mean none)
    variant: bool = False  #: a factorial cell marked ``meta['variant']``
    transfer_setting: str | None = None  #: the main-table transfer column it is evaluated in
    in_dist_of: str | None = None  #: the transfer setting whose in-distribution test this is (like-for-like gap)
    cell: tuple[str, str, str] | None = None  #: (matrix, train_on, test_on) of a transfer-matrix cell

    @classmethod
    def of(cls, meta: dict[str, Any]) -> RunRole:
        ab = meta.get("ablation")
        ts, home = meta.get("transfer_setting"), meta.get("in_dist_of")
        cell = ((str(meta.get("matrix", "transfer")), str(meta["train_on"]), str(meta["test_on"]))
                if "train_on" in meta and "test_on" in meta else None)
        return cls(None if ab in (None, "", "none") else str(ab), bool(meta.get("variant")),
                   None if "transfer_setting" not in meta else str(ts),
                   None if "in_dist_of" not in meta else str(home), cell)

    @property
    def is_variant(self) -> bool:
        """An ablation or a factorial cell: reported in Table 4 / App. F, not as a detector row."""
        return self.ablation is not None or self.variant

    @property
    def is_main(self) -> bool:
        """A main run: no ablation, no transfer column, no transfer-matrix cell nor the in-distribution test of
        one (the appendix analyses and the instance ensemble read these)."""
        return self.ablation is None and self.transfer_setting is None and self.in_dist_of is None \
            and self.cell is None


@dataclass
class Predictions:
    """Per-trace outputs of one detector run. ``prob`` is P(faithful) (label 1 = φ* = 1 = faithful)."""

    detector: str
    seed: int | None  # None for an ensemble
    split: str
    threshold: float  # frozen on in-distribution validation
    trace_id: np.ndarray  # [N] str
    base_item: np.ndarray  # [N] str (cluster id for the bootstrap)
    domain: np.ndarray  # [N] str
    model: np.ndarray  # [N] str (source-model family)
    condition: np.ndarray  # [N] str (FaithShift condition the trace was generated under)
    label: np.ndarray  # [N] int, verified φ*
    prob: np.ndarray  # [N] float, detector's P(faithful)
    meta: dict[str, Any] = field(default_factory=dict)  # config hash, run folder, trained-on, ...

    @property
    def role(self) -> RunRole:
        """The run's role in the report (:class:`RunRole`)."""
        return RunRole.of(self.meta)

    @property
    def ensemble_of(self) -> str | None:
        """The detector a seed ensemble averages (its run spec's, :data:`ENSEMBLE_OF`); None when unknown."""
        of = self.meta.get(ENSEMBLE_OF)
        return None if of is None else str(of)

    def __post_init__(self) -> None:
        for name in _ARRAYS:
            setattr(self, name, np.asarray(getattr(self, name)))
        n = len(self.trace_id)
        bad = [f"{k} has {len(getattr(self, k))}" for k in _ARRAYS if len(getattr(self, k)) != n]
        if bad:
            raise SiftError(f"Predictions({self.detector}, seed {self.seed}): {n} trace ids but " + "; ".join(bad))
        who = f"Predictions({self.detector}, seed {self.seed}, {self.split})"
        try:
            prob = self.prob.astype(float)
            label = self.label.astype(float)
        except (TypeError, ValueError) as e:
            raise SiftError(f"{who}: labels and probabilities must be numbers ({e})") from None
        if n and not np.all(np.isfinite(prob)):
            raise SiftError(f"{who}: non-finite probabilities")
        if n and (prob.min() < 0 or prob.max() > 1):
            raise SiftError(f"{who}: probabilities must lie in [0, 1], found {prob.min():.4g}..{prob.max():.4g}")
        bad = ~np.isin(label, (0, 1))
        if n and bad.any():
            raise SiftError(f"{who}: labels must be 0 or 1 (verified φ*), found {label[bad][0]:g} "
                            f"({int(bad.sum())} rows)")
        if n and len(np.unique(self.trace_id.astype(str))) != n:
            ids, counts = np.unique(self.trace_id.astype(str), return_counts=True)
            raise SiftError(f"{who}: trace ids must be unique, {str(ids[counts > 1][0])!r} appears "
                            f"{int(counts.max())} times")
        try:
            ok = math.isfinite(float(self.threshold))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise SiftError(f"{who}: threshold must be a finite number, got {self.threshold!r}")
        self.label = label.astype(int)
        self.prob = prob

    def __len__(self) -> int:
        return len(self.trace_id)

    @property
    def verdict(self) -> np.ndarray:
        """1 = judged faithful (prob ≥ frozen threshold)."""
        return (self.prob >= self.threshold).astype(int)

    @property
    def confidence(self) -> np.ndarray:
        return gate(self.prob)

    @property
    def correct(self) -> np.ndarray:
        return (self.verdict == self.label).astype(int)

    def index(self) -> dict[str, int]:
        """trace_id → row."""
        return {t: i for i, t in enumerate(self.trace_id.tolist())}

    def subset(self, mask: np.ndarray) -> Predictions:
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        kw.update({k: getattr(self, k)[mask] for k in _ARRAYS})
        return Predictions(**kw)

    def save(self, path: str | Path) -> Path:
        import json

        path = Path(path)
        header = {"detector": self.detector, "seed": self.seed, "split": self.split,
                  "threshold": self.threshold, "meta": self.meta}
        with atomic_open(path, "wb") as fh:
            np.savez(fh, header=np.array(json.dumps(header, default=str)),
                     **{k: getattr(self, k) for k in _ARRAYS})
        return path

    @classmethod
    def load(cls, path: str | Path) -> Predictions:
        import json

        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as z:
                header = json.loads(str(z["header"]))
                arrays = {k: z[k] for k in _ARRAYS}
        except (OSError, KeyError, ValueError) as e:
            raise SiftError(f"{path}: not a sift predictions file ({e})") from e
        return cls(**header, **arrays)


def average(members: Iterable[Predictions], detector: str, threshold: float) -> Predictions:
    """Probability-average ensemble of runs on the same traces (same order required)."""
    members = list(members)
    if not members:
        raise SiftError(f"ensemble {detector!r}: no member predictions")
    ref = members[0]
    for m in members[1:]:
        if not np.array_equal(m.trace_id, ref.trace_id):
            raise SiftError(f"ensemble {detector!r}: members {ref.detector}/{ref.seed} and {m.detector}/{m.seed} "
                            "cover different traces")
    prob = np.mean([m.prob for m in members], axis=0)
    return Predictions(detector, None, ref.split, threshold, ref.trace_id, ref.base_item, ref.domain, ref.model,
                       ref.condition, ref.label, prob, meta={"members": [(m.detector, m.seed) for m in members]})


@dataclass
class Pairs:
    """Verified pairs of a split (from the corpus's ``pairs.jsonl``), by trace id."""

    axis: np.ndarray  # [P] str (FaithShift axis)
    kind: np.ndarray  # [P] str: preserving | altering
    source_id: np.ndarray  # [P] str
    shifted_id: np.ndarray  # [P] str
    phi_source: np.ndarray  # [P] int
    phi_shifted: np.ndarray  # [P] int
    base_item: np.ndarray  # [P] str

    def __post_init__(self) -> None:
        for f in fields(self):
            setattr(self, f.name, np.asarray(getattr(self, f.name)))

    def __len__(self) -> int:
        return len(self.axis)

    def select(self, kind: str | None = None, axis: str | None = None) -> Pairs:
        m = np.ones(len(self), bool)
        if kind is not None:
            m &= self.kind == kind
        if axis is not None:
            m &= self.axis == axis
        return Pairs(**{f.name: getattr(self, f.name)[m] for f in fields(self)})

    def rows(self, preds: Predictions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Row indices of (source, shifted) in ``preds`` and a mask of the pairs whose both traces it has."""
        idx = preds.index()
        keep = np.array([s in idx and t in idx for s, t in zip(self.source_id, self.shifted_id)], bool)
        src = np.array([idx.get(s, -1) for s in self.source_id], int)
        dst = np.array([idx.get(t, -1) for t in self.shifted_id], int)
        return src, dst, keep

    @classmethod
    def from_corpus(cls, corpus_dir: str | Path) -> Pairs:
        """The verified pairs of a corpus folder's ``pairs.jsonl`` (dropped pairs are left out)."""
        from sift.corpus.store import read_jsonl

        path = Path(corpus_dir) / "pairs.jsonl"
        if not path.exists():
            raise SiftError(f"{path}: no pairs file (build the corpus with sift-corpus first)")
        rows = [r for r in read_jsonl(path) if r.get("verified")]
        cols = {"axis": "axis", "kind": "kind", "source_id": "source", "shifted_id": "shifted",
                "phi_source": "phi_source", "phi_shifted": "phi_shifted", "base_item": "base_item"}
        try:
            pairs = cls(**{k: [r[v] for r in rows] for k, v in cols.items()})
        except KeyError as e:
            raise SiftError(f"{path}: pair record without field {e}") from e
        for k in ("phi_source", "phi_shifted"):
            vals = getattr(pairs, k)
            bad = [v for v in vals.tolist() if isinstance(v, bool) or v not in (0, 1)]
            if bad:
                raise SiftError(f"{path}: verified pair field {k!r} must be 0 or 1, got {bad[0]!r}")
            setattr(pairs, k, vals.astype(int))
        return pairs
