"""The early-commitment answer probe: multinomial logistic regression from final-layer states to the final answer.

Fit on training-split states only (the DataModule's ``setup``); ``e_t = P(y_final | H[L,t])``. An answer the
probe never saw in training gets probability 0 (so EC = 0 on, e.g., a held-out domain with new answers).
States are standardised first (scikit-learn's ``LogisticRegression`` with L2 penalty ``C``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class AnswerProbe:
    def __init__(self, C: float = 1.0, max_iter: int = 300, seed: int = 0):
        self.C, self.max_iter, self.seed = C, max_iter, seed
        self.classes_: list[str] = []
        self._const: str | None = None

    def fit(self, X: np.ndarray, y: Sequence[str]) -> "AnswerProbe":
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
