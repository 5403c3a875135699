"""A hand-computable toy: 4 base items, traces b (base), p (paraphrase), h (hint format), a (altered).

Seed 0 (threshold 0.5):          verdicts                 hand values
  paraphrase pairs b→p: i0 ok, i1 viol, i2 ok, i3 viol    IVR_paraphrase = 2/4
  hint_format pairs b→h: i0 ok, i2 viol, i3 ok            IVR_hint = 1/3, macro mean 5/12
  altering b→a: i0 ok, i1 fail, i2 ok, i3 fail            AS = 1/2, MFS = 7/13
Seed 1 differs on i1/b (0.3) and i3/b (0.6): IVR 1/3 (0, 2/3), AS 1/2, MFS 4/7.
Seed-repeat (seeds 0, 1, 7 preserving pairs): floor 3/7, shift 3/7, overlap 2/7, raw 4/7.
Probability-average ensemble (threshold 0.5): IVR (1/4 + 2/3)/2 = 11/24, AS 1/2, MFS 13/25.
Seed 0 errors at threshold 0.5: i1/p, i3/p, i1/a, i3/a, i2/h → 5 of 15.
"""

from __future__ import annotations

import math

import numpy as np

from sift.evaluation.predictions import Pairs, Predictions
from sift.metrics.selective import SelectiveConfig

#: one candidate threshold ρ ≥ 0.75, δ' = δ = 0.5: on toy seed 0, 7 of 15 traces selected, all correct
CERT = SelectiveConfig(alpha=0.7, delta=0.5, candidates=(0.75,), alphas=(0.7,), match_coverage=0.7)


def est(res: dict, key: str) -> float:
    """The point estimate of a results cell."""
    return res[key]["estimate"]

TRACES = {  # trace id: (label, prob seed 0)
    "i0/b": (1, 0.9), "i1/b": (1, 0.7), "i2/b": (0, 0.3), "i3/b": (0, 0.45),
    "i0/p": (1, 0.8), "i1/p": (1, 0.4), "i2/p": (0, 0.1), "i3/p": (0, 0.55),
    "i0/a": (0, 0.2), "i1/a": (0, 0.6), "i2/a": (1, 0.9), "i3/a": (1, 0.35),
    "i0/h": (1, 0.95), "i2/h": (0, 0.6), "i3/h": (0, 0.2),
}
SEED1 = {"i1/b": 0.3, "i3/b": 0.6}
COND = {"b": "base", "p": "paraphrase", "h": "hint_format", "a": "cue_injection"}


def predictions(seed: int | None = 0, detector: str = "toy", split: str = "test", probs: dict | None = None,
                threshold: float = 0.5) -> Predictions:
    ids = list(TRACES)
    prob = {t: v[1] for t, v in TRACES.items()}
    if seed == 1:
        prob.update(SEED1)
    if probs:
        prob.update(probs)
    return Predictions(detector, seed, split, threshold, np.array(ids), np.array([t.split("/")[0] for t in ids]),
                       np.array(["arith"] * len(ids)), np.array(["m0"] * len(ids)),
                       np.array([COND[t[-1]] for t in ids]), np.array([TRACES[t][0] for t in ids]),
                       np.array([prob[t] for t in ids]))


def pairs() -> Pairs:
    rows = [("paraphrase", "preserving", f"i{k}/b", f"i{k}/p") for k in range(4)]
    rows += [("hint_format", "preserving", f"i{k}/b", f"i{k}/h") for k in (0, 2, 3)]
    rows += [("cue_injection" if TRACES[f"i{k}/b"][0] == 1 else "cue_verbalization", "altering", f"i{k}/b", f"i{k}/a")
             for k in range(4)]
    return Pairs(axis=[r[0] for r in rows], kind=[r[1] for r in rows], source_id=[r[2] for r in rows],
                 shifted_id=[r[3] for r in rows], phi_source=[TRACES[r[2]][0] for r in rows],
                 phi_shifted=[TRACES[r[3]][0] for r in rows], base_item=[r[2].split("/")[0] for r in rows])


def betting_reference(n_sel, n_err, scale, delta, tune_at, cap=0.95):
    """The item bound written out with loops (docs/design.md §7): plug-in bets on D(tune_at), then the smallest r
    on a 1e-5 grid whose running capital reaches 1/δ."""
    n, e = np.asarray(n_sel, float), np.asarray(n_err, float)
    d = (tune_at * n - e) / ((1 - tune_at) * scale)
    bets = []
    for i in range(n.size):
        prev = d[:i]
        var = (0.25 + ((prev - prev.mean()) ** 2).sum() if i else 0.25) / (i + 1)
        bets.append(min(cap, math.sqrt(2 * math.log(1 / delta) / (n.size * var))))
    for r in np.arange(0, 1, 1e-5):
        cap_r, best = 1.0, 1.0
        for lam, ni, ei in zip(bets, n, e):
            cap_r *= 1 + lam * (r * ni - ei) / ((1 - r) * scale)
            best = max(best, cap_r)
        if best >= 1 / delta:
            return r
    return 1.0


def auroc_by_pairs(score, label) -> float:
    """P(score of a label-1 trace > score of a label-0 trace) + ½ P(tie), over all such pairs (written out)."""
    s, y = np.asarray(score, float), np.asarray(label).astype(int)
    d = s[y == 1][:, None] - s[y == 0][None, :]
    return float(((d > 0).sum() + 0.5 * (d == 0).sum()) / d.size)


def main_row_by_hand(job, detector: str, seeds) -> tuple[float, float]:
    """A main-table row's in-distribution AUROC and IVR recomputed from a main job's files alone: per seed, the
    AUROC of ``runs/main/<detector>/seed<s>/predictions/test.npz`` (labels checked against the corpus's φ*) and
    the IVR, the macro mean over preserving axes of the share of the corpus's verified preserving pairs (both
    traces in the file) whose verdicts (prob ≥ the file's frozen threshold) differ; then the mean over seeds."""
    import json
    from pathlib import Path

    def lines(name: str) -> list[dict]:
        return [json.loads(x) for x in (Path(job) / "corpus" / name).read_text().splitlines() if x.strip()]

    job = Path(job)
    phi = {t["trace_id"]: t["phi"] for t in lines("traces.jsonl")}
    pres = [p for p in lines("pairs.jsonl") if p["verified"] and p["kind"] == "preserving"]
    aurocs, ivrs = [], []
    for s in seeds:
        with np.load(job / "runs" / "main" / detector / f"seed{s}" / "predictions" / "test.npz") as z:
            thr = float(json.loads(str(z["header"]))["threshold"])
            ids, prob, label = z["trace_id"].astype(str).tolist(), z["prob"].astype(float), z["label"].astype(int)
        assert label.tolist() == [phi[t] for t in ids]
        aurocs.append(auroc_by_pairs(prob, label))
        verdict = {t: p >= thr for t, p in zip(ids, prob.tolist())}
        flips: dict[str, list[bool]] = {}
        for p in pres:
            if p["source"] in verdict and p["shifted"] in verdict:
                flips.setdefault(p["axis"], []).append(verdict[p["source"]] != verdict[p["shifted"]])
        assert flips, f"{detector} seed {s}: no preserving pair in the test split"
        ivrs.append(float(np.mean([np.mean(v) for v in flips.values()])))
    return float(np.mean(aurocs)), float(np.mean(ivrs))
