"""The early-commitment answer probe: multinomial logistic regression from final-layer states to the final answer.

Fit per source model on training-split states only; ``e_t = P(y_final | H[L,t])``. An answer the probe never
saw in training gets probability 0 (so EC = 0 on, e.g., a held-out domain with new answers). States are
standardised first (scikit-learn's ``LogisticRegression`` with L2 penalty ``C``).

:func:`early_commitment_curves` is the trajectory stage's product for one split: the probe's curve e_t of every
trace, cached under a key of the shards, the train items and the probe settings (a DataModule loads it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from sift.atomic import atomic_open
from sift.provenance import content_hash
from sift.trajectories import cache as C


class AnswerProbe:
    def __init__(self, C: float = 1.0, max_iter: int = 300, seed: int = 0):
        self.C, self.max_iter, self.seed = C, max_iter, seed
        self.classes_: list[str] = []
        self._const: str | None = None

    def fit(self, X: np.ndarray, y: Sequence[str]) -> AnswerProbe:
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import StandardScaler

        y = np.asarray([str(v) for v in y])
        self.classes_ = sorted(set(y.tolist()))
        if len(self.classes_) == 1:
            self._const = self.classes_[0]
            return self
        self.scaler = StandardScaler().fit(X)
        self.clf = LogisticRegression(C=self.C, max_iter=self.max_iter, random_state=self.seed)
        self.clf.fit(self.scaler.transform(X), y)
        self._col = {c: i for i, c in enumerate(self.clf.classes_)}
        return self

    def prob_of(self, X: np.ndarray, answer: str | None) -> np.ndarray:
        """P(answer | state) for each row of ``X`` (0 for an unseen or missing answer)."""
        if answer is None or str(answer) not in self.classes_ or len(X) == 0:
            return np.zeros(len(X), dtype=np.float32)
        if self._const is not None:
            return np.ones(len(X), dtype=np.float32)
        p = self.clf.predict_proba(self.scaler.transform(X))
        return p[:, self._col[str(answer)]].astype(np.float32)

    def prob_rows(self, states: np.ndarray, offsets: Sequence[int], answers: Sequence[str | None]) -> list[np.ndarray]:
        """``prob_of`` for many traces at once: trace i owns rows ``offsets[i]:offsets[i+1]`` of ``states``
        (one ``predict_proba`` call for the whole block)."""
        n = len(answers)
        if self._const is not None:
            return [np.full(offsets[i + 1] - offsets[i], float(answers[i] is not None and str(answers[i]) ==
                                                              self._const), dtype=np.float32) for i in range(n)]
        p = self.clf.predict_proba(self.scaler.transform(states)) if len(states) else np.zeros((0, 1))
        out = []
        for i, a in enumerate(answers):
            lo, hi = offsets[i], offsets[i + 1]
            col = self._col.get(str(a)) if a is not None else None
            out.append(p[lo:hi, col].astype(np.float32) if col is not None else np.zeros(hi - lo, dtype=np.float32))
        return out


def _shard_paths(trajectory_dir: Path, info: Mapping[str, dict]) -> list[tuple[str, Path]]:
    return [(m, trajectory_dir / s) for m in sorted(info) for s in info[m]["shards"]]


def curves_cache_path(cache_dir: str | Path | None, info: Mapping[str, dict], train_items: set[str], C_: float,
                      max_samples: int, seed: int) -> Path | None:
    """Where the curves of a split live in ``cache_dir`` (None: not cached)."""
    if cache_dir is None:
        return None
    key = content_hash(sorted(train_items), {m: info[m]["key"] for m in sorted(info)}, C_, max_samples, seed,
                       "answer-probe/1")
    return Path(cache_dir) / f"early_commitment-{key}.pt"


def fit_answer_probes(trajectory_dir: Path, info: Mapping[str, dict], traces: Mapping[str, tuple[str, str, object]],
                      train_items: set[str], *, C_: float = 1.0, max_samples: int = 20_000,
                      seed: int = 0) -> dict[str, AnswerProbe]:
    """One probe per model, fit on a sample of final-layer states of its traces on train items that have an
    answer (``traces``: trace id → (model, base item, answer)); at most about ``max_samples`` states per model,
    spread evenly over its traces (a seeded choice of steps within each trace). Only the CoT's steps are
    sampled (the answer line's, ``n_answer`` per trace, are read by the fitted probe, never fit on)."""
    n_train = {m: 0 for m in info}
    for model, item, answer in traces.values():
        if item in train_items and answer is not None:
            n_train[model] += 1
    per_trace = {m: max(1, math.ceil(max_samples / max(n, 1))) for m, n in n_train.items()}
    rng = np.random.default_rng(seed)
    samples: dict[str, tuple[list[np.ndarray], list[str]]] = {m: ([], []) for m in info}
    for m, path in _shard_paths(trajectory_dir, info):
        t, meta = C.read_shard(path)
        off = t["bin_offsets"].tolist()
        n_ans = t["n_answer"].tolist()
        for i, tid in enumerate(meta["trace_ids"]):
            tr = traces.get(tid)
            end = off[i + 1] - n_ans[i]
            if tr is None or tr[1] not in train_items or tr[2] is None or end <= off[i]:
                continue
            states = t["final"][off[i]:end].float().numpy()
            k = min(per_trace[m], len(states))
            pick = rng.choice(len(states), size=k, replace=False) if k < len(states) else np.arange(len(states))
            samples[m][0].append(states[pick])
            samples[m][1].extend([str(tr[2])] * k)
    return {m: AnswerProbe(C=C_, seed=seed).fit(np.concatenate(xs), ys) for m, (xs, ys) in samples.items() if ys}


def probe_curves(trajectory_dir: Path, info: Mapping[str, dict], traces: Mapping[str, tuple[str, str, object]],
                 probes: Mapping[str, AnswerProbe]) -> dict[str, torch.Tensor]:
    """e_t of every trace of the shards (zeros for a model without a probe)."""
    curves: dict[str, torch.Tensor] = {}
    for m, path in _shard_paths(trajectory_dir, info):
        t, meta = C.read_shard(path)
        off = t["bin_offsets"].tolist()
        probe = probes.get(m)
        answers = [traces[tid][2] if tid in traces else None for tid in meta["trace_ids"]]
        rows = probe.prob_rows(t["final"].float().numpy(), off, answers) if probe is not None else None
        for i, tid in enumerate(meta["trace_ids"]):
            e = rows[i] if rows is not None else np.zeros(off[i + 1] - off[i], dtype=np.float32)
            curves[tid] = torch.from_numpy(np.asarray(e, dtype=np.float32))
    return curves


def early_commitment_curves(trajectory_dir: str | Path, info: Mapping[str, dict],
                            traces: Mapping[str, tuple[str, str, object]], train_items: set[str], *,
                            C_: float = 1.0, max_samples: int = 20_000, seed: int = 0,
                            cache_dir: str | Path | None = None) -> dict[str, torch.Tensor]:
    """The answer probes' curves e_t of every trace of a trajectory folder for one split: read from
    ``cache_dir`` when a cache for the same shards, train items and settings exists, else fit and cached
    (atomically, under a file lock: parallel runs on the same split fit the probes once).

    ``info``: the trajectory manifest's entry of each model used; ``traces``: trace id → (model, base item,
    answer) of the traces used."""
    from filelock import FileLock

    from sift.checkpoints import load_checkpoint

    trajectory_dir = Path(trajectory_dir)
    path = curves_cache_path(cache_dir, info, train_items, C_, max_samples, seed)

    def produce() -> dict[str, torch.Tensor]:
        if path is not None and path.is_file():
            cached = load_checkpoint(path, what="early-commitment cache")
            if set(cached) == set(traces):
                return cached
        probes = fit_answer_probes(trajectory_dir, info, traces, train_items, C_=C_, max_samples=max_samples,
                                   seed=seed)
        curves = probe_curves(trajectory_dir, info, traces, probes)
        if path is not None:
            with atomic_open(path, "wb") as fh:
                torch.save(curves, fh)
        return curves

    if path is None or path.is_file():
        return produce()
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        return produce()
