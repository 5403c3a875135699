"""Perturbation attributions for System-1 heads (paper 003 §3.4; spec ``system1-and-edct-metrics.md`` A2.8–A2.11).

A *game* is ``value_fn(mask) -> float``: the probability p(y* | state with the features in ``mask``
present), y* the prediction on the full input. Implemented here without the ``shap`` package:

* KernelSHAP: Shapley-kernel weighted least squares with φ₀ = v(0) and Σφ = v(1) − v(0) enforced by
  eliminating one variable; exact enumeration when 2^M ≤ budget, else shap.KernelExplainer-style
  paired sampling.
* S1-SHAP: the same coalitions and cached outputs, on v_S1 = logit(clip(p, ε, 1 − ε)), ε = 1e-4.
  (``shap``'s built-in logit link does not clip; we clip first.)
* Pairwise interactions (SII, ArchDetect, LOO-pair) over a restricted top-k game and gate recovery.
* ERASER comprehensiveness / sufficiency, deletion / insertion AUC, Prec@g, mass share.

Why KernelSHAP stays in-house rather than ``shap.KernelExplainer``: S1-SHAP needs the *same* coalitions and
cached model outputs on a second, clipped-logit value function, and the interaction indices reuse them too;
``shap`` draws its own coalitions and links without clipping, so it would evaluate the model twice and still
not give S1-SHAP. It would also add a heavy dependency (numba, its compiled extensions) for one estimator. The
in-house estimator is checked against exact Shapley enumeration in ``tests/companion``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from sift.errors import SiftError

ValueFn = Callable[[np.ndarray], float]
CLIP_EPS = 1e-4


def logit_link(p, eps: float = CLIP_EPS):
    """ln(p̃/(1 − p̃)) with p̃ = clip(p, ε, 1 − ε); range ±9.21 for ε = 1e-4 [P]."""
    q = np.clip(np.asarray(p, dtype=float), eps, 1.0 - eps)
    out = np.log(q / (1.0 - q))
    return float(out) if out.ndim == 0 else out


class CachedGame:
    """Memoised value function; ``key_fn`` may map a mask to its rendered string (the paper's cache key)."""

    def __init__(self, value_fn: ValueFn, n_features: int, key_fn: Callable[[np.ndarray], Hashable] | None = None):
        self.value_fn = value_fn
        self.n_features = n_features
        self.key_fn = key_fn or (lambda m: np.packbits(m).tobytes())
        self.cache: dict[Hashable, float] = {}
        self.n_requests = 0

    def __call__(self, mask: np.ndarray) -> float:
        m = np.asarray(mask, dtype=bool)
        self.n_requests += 1
        k = self.key_fn(m)
        if k not in self.cache:
            self.cache[k] = float(self.value_fn(m))
        return self.cache[k]

    @property
    def n_model_calls(self) -> int:
        return len(self.cache)


def _game(value_fn, m: int) -> CachedGame:
    return value_fn if isinstance(value_fn, CachedGame) else CachedGame(value_fn, m)


def _link(name: str, eps: float) -> Callable[[float], float]:
    if name == "identity":
        return float
    if name == "logit":
        return lambda v: logit_link(v, eps)
    raise SiftError(f"link must be 'identity' or 'logit', got {name!r}")


def shapley_kernel_weight(m: int, s: int) -> float:
    """π(z) = (M − 1) / (C(M, |z|) |z| (M − |z|)); infinite for |z| ∈ {0, M}."""
    if s in (0, m):
        return math.inf
    return (m - 1) / (math.comb(m, s) * s * (m - s))


def exact_shapley(value_fn: ValueFn, m: int, link: str = "identity", eps: float = CLIP_EPS) -> np.ndarray:
    """Shapley values by the subset formula φ_i = Σ_S |S|!(M−|S|−1)!/M! [v(S∪i) − v(S)] (reference)."""
    g, f = _game(value_fn, m), _link(link, eps)
    phi = np.zeros(m)
    for i in range(m):
        others = [j for j in range(m) if j != i]
        for s in range(m):
            w = math.factorial(s) * math.factorial(m - s - 1) / math.factorial(m)
            for sub in combinations(others, s):
                mask = np.zeros(m, bool)
                mask[list(sub)] = True
                without = f(g(mask))
                mask[i] = True
                phi[i] += w * (f(g(mask)) - without)
    return phi


@dataclass(frozen=True)
class ShapResult:
    phi: np.ndarray  #: attributions (in link units); Σφ = link(v(1)) − link(v(0))
    base_value: float  #: φ₀ = link(v(0)) (empty-coalition background)
    full_value: float  #: link(v(1))
    link: str
    n_coalitions: int  #: distinct coalitions used in the regression (excluding ∅ and the full set)
    exact: bool  #: all 2^M − 2 coalitions enumerated


def _kernel_coalitions(m: int, budget: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, bool]:
    """Coalitions and weights following shap.KernelExplainer: complete subset-size pairs (s, M−s) while the
    budget allows, then sizes sampled from the remaining kernel mass with paired complements, duplicates
    merged into their weights. Returns (masks, weights, exact)."""
    n_sizes = (m - 1 + 1) // 2  # ceil((M−1)/2)
    n_paired = (m - 1) // 2
    wv = np.array([(m - 1.0) / (s * (m - s)) for s in range(1, n_sizes + 1)])
    wv[:n_paired] *= 2
    wv /= wv.sum()
    masks: list[np.ndarray] = []
    weights: list[float] = []
    left = budget
    full_sizes = 0
    rem = wv.copy()
    for idx, s in enumerate(range(1, n_sizes + 1)):
        n_sub = math.comb(m, s) * (2 if idx < n_paired else 1)
        if left * rem[idx] / n_sub >= 1.0 - 1e-8:
            full_sizes += 1
            left -= n_sub
            if rem[idx] < 1:
                rem /= 1 - rem[idx]
            w = wv[idx] / math.comb(m, s)
            if idx < n_paired:
                w /= 2
            for sub in combinations(range(m), s):
                z = np.zeros(m, bool)
                z[list(sub)] = True
                masks.append(z)
                weights.append(w)
                if idx < n_paired:
                    masks.append(~z)
                    weights.append(w)
        else:
            break
    exact = full_sizes == n_sizes
    if not exact and left > 0:
        rem_w = wv.copy()
        rem_w[:n_paired] /= 2  # each paired draw also adds its complement
        rem_w = rem_w[full_sizes:]
        rem_w /= rem_w.sum()
        seen: dict[bytes, int] = {}
        samp_masks: list[np.ndarray] = []
        samp_w: list[float] = []
        n_tries = 0
        while left > 0 and n_tries < 100 * budget:
            n_tries += 1
            s = full_sizes + 1 + int(rng.choice(rem_w.size, p=rem_w))
            z = np.zeros(m, bool)
            z[rng.permutation(m)[:s]] = True
            for zz in (z, ~z) if s <= n_paired else (z,):
                key = zz.tobytes()
                if key in seen:
                    samp_w[seen[key]] += 1.0
                else:
                    if left <= 0:
                        continue
                    seen[key] = len(samp_masks)
                    samp_masks.append(zz)
                    samp_w.append(1.0)
                    left -= 1
        if samp_masks:
            sw = np.array(samp_w)
            sw *= wv[full_sizes:].sum() / sw.sum()
            masks += samp_masks
            weights += sw.tolist()
    return np.array(masks, dtype=bool).reshape(-1, m), np.array(weights), exact


def kernel_shap(
    value_fn: ValueFn,
    n_features: int,
    *,
    n_coalitions: int = 512,
    link: str = "identity",
    eps: float = CLIP_EPS,
    seed: int = 0,
) -> ShapResult:
    """KernelSHAP [P §3.4]: N = min(2^M − 2, 512) coalitions besides ∅ and the full set (exact for M ≤ 9),
    background = empty coalition, no ℓ1 step.

    Solves the Shapley-kernel weighted least squares with φ₀ = v(0) and Σφ = v(1) − v(0) imposed by
    eliminating the last variable (the infinite weight on ∅ and the full set). Exact when 2^M ≤ budget.
    """
    m = n_features
    g, f = _game(value_fn, m), _link(link, eps)
    v0 = f(g(np.zeros(m, bool)))
    v1 = f(g(np.ones(m, bool)))
    if m == 1:
        return ShapResult(np.array([v1 - v0]), v0, v1, link, 0, True)
    budget = min(2**m - 2, n_coalitions)
    z, w, exact = _kernel_coalitions(m, budget, np.random.default_rng(seed))
    y = np.array([f(g(zz)) for zz in z]) - v0
    total = v1 - v0
    zf = z.astype(float)
    a = zf[:, :-1] - zf[:, -1:]
    b = y - zf[:, -1] * total
    sw = np.sqrt(w)
    sol, *_ = np.linalg.lstsq(a * sw[:, None], b * sw, rcond=None)
    phi = np.append(sol, total - sol.sum())
    return ShapResult(phi, v0, v1, link, int(z.shape[0]), bool(exact and z.shape[0] == 2**m - 2))


def s1_shap(value_fn: ValueFn, n_features: int, *, n_coalitions: int = 512, eps: float = CLIP_EPS,
            seed: int = 0) -> ShapResult:
    """S1-SHAP [P]: KernelSHAP on v_S1 = logit(clip(p, ε, 1 − ε)); log-odds units, Σφ = v_S1(1) − v_S1(0).

    Pass the same ``CachedGame`` used for probability KernelSHAP to reuse its model calls (zero extra calls).
    """
    return kernel_shap(value_fn, n_features, n_coalitions=n_coalitions, link="logit", eps=eps, seed=seed)


def loo_attribution(value_fn: ValueFn, n_features: int, link: str = "identity", eps: float = CLIP_EPS) -> np.ndarray:
    """Leave-one-out φ_i = v(1) − v(1_{−i}) (M + 1 calls)."""
    g, f = _game(value_fn, n_features), _link(link, eps)
    full = np.ones(n_features, bool)
    v1 = f(g(full))
    out = np.empty(n_features)
    for i in range(n_features):
        mk = full.copy()
        mk[i] = False
        out[i] = v1 - f(g(mk))
    return out


# ----------------------------------------------------------------------------------------------
# Pairwise interactions and gate recovery [A2.11]
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interactions:
    """k×k symmetric matrices (diagonal 0) over the restricted game's features."""

    features: tuple[int, ...]
    sii: np.ndarray  #: Shapley interaction index (Grabisch–Roubens)
    archdetect: np.ndarray  #: ½[Δ_ij(∅) + Δ_ij(N∖{i,j})], signed
    loo_pair: np.ndarray  #: Δ_ij(N∖{i,j})
    mean_context: np.ndarray  #: uniform mean of Δ_ij(S) over all contexts (alternative reading)
    space: str


def pairwise_interactions(
    value_fn: ValueFn,
    n_features: int,
    features: Sequence[int],
    *,
    space: str = "prob",
    base_mask: np.ndarray | None = None,
    eps: float = CLIP_EPS,
) -> Interactions:
    """Exact interactions on the restricted game over ``features`` (k ≤ 6 ⇒ 2^k ≤ 64 calls) with all other
    features held at ``base_mask`` (default: present). ``space``: 'prob' (v_prob) or 'logit' (v_S1).

    Δ_ij(S) = v(S∪{i,j}) − v(S∪{i}) − v(S∪{j}) + v(S); SII = Σ_S |S|!(k−|S|−2)!/(k−1)! Δ_ij(S).
    """
    feats = tuple(int(i) for i in features)
    k = len(feats)
    g = _game(value_fn, n_features)
    f = _link({"prob": "identity", "logit": "logit"}[space], eps)
    base = np.ones(n_features, bool) if base_mask is None else np.asarray(base_mask, bool).copy()
    vals: dict[int, float] = {}
    for code in range(2**k):
        mk = base.copy()
        for b, feat in enumerate(feats):
            mk[feat] = bool(code >> b & 1)
        vals[code] = f(g(mk))
    sii, arch, loo, unif = (np.zeros((k, k)) for _ in range(4))
    full = 2**k - 1
    for i, j in combinations(range(k), 2):
        bi, bj = 1 << i, 1 << j
        rest = [b for b in range(k) if b not in (i, j)]
        tot, tot_u = 0.0, 0.0
        for r in range(len(rest) + 1):
            w = math.factorial(r) * math.factorial(k - r - 2) / math.factorial(k - 1)
            for sub in combinations(rest, r):
                s = sum(1 << b for b in sub)
                d = vals[s | bi | bj] - vals[s | bi] - vals[s | bj] + vals[s]
                tot += w * d
                tot_u += d
        s_top = full & ~bi & ~bj
        d_top = vals[full] - vals[s_top | bj] - vals[s_top | bi] + vals[s_top]
        d_empty = vals[bi | bj] - vals[bi] - vals[bj] + vals[0]
        for mat, val in ((sii, tot), (arch, 0.5 * (d_empty + d_top)), (loo, d_top), (unif, tot_u / 2 ** len(rest))):
            mat[i, j] = mat[j, i] = val
    return Interactions(feats, sii, arch, loo, unif, space)


@dataclass(frozen=True)
class GateRecovery:
    pair_precision: float  #: |top-C(g,2) pairs by |I| ∩ true pairs| / C(g,2)
    sign_accuracy: float  #: share of true pairs with sign(I) = expected (0 counts as wrong)
    recovered: bool  #: pair_precision = 1 and sign_accuracy = 1
    n_true_pairs: int


def gate_recovery(interaction: np.ndarray, features: Sequence[int], triggers: Sequence[int], gate: str) -> GateRecovery:
    """Score an interaction matrix against a planted gate: OR expects negative, AND positive interactions.

    Pairs are ranked by |I_ij| with lexicographic pair-index tie-break [R]; triggers missing from
    ``features`` count as unrecovered pairs.
    """
    sign = {"OR": -1, "AND": 1}[gate.upper()]
    feats = list(features)
    true_pairs = {tuple(sorted(p)) for p in combinations(triggers, 2)}
    n_true = len(true_pairs)
    if n_true == 0:
        raise SiftError("gate_recovery needs at least two triggers")
    pairs = list(combinations(range(len(feats)), 2))
    ranked = sorted(pairs, key=lambda p: (-abs(interaction[p]), p))[:n_true]
    hit = sum((tuple(sorted((feats[a], feats[b]))) in true_pairs) for a, b in ranked)
    pos = {f: i for i, f in enumerate(feats)}
    signs = [
        (a in pos and b in pos and np.sign(interaction[pos[a], pos[b]]) == sign) for a, b in true_pairs
    ]
    prec, sacc = hit / n_true, float(np.mean(signs))
    return GateRecovery(prec, sacc, prec == 1.0 and sacc == 1.0, n_true)


def top_k_features(phi, k: int) -> tuple[int, ...]:
    """Top-k by signed attribution, descending; ties by feature index [R]."""
    p = np.asarray(phi, float)
    order = np.lexsort((np.arange(p.size), -p))
    return tuple(int(i) for i in order[:k])


def gate_recovery_run(
    value_fn: ValueFn,
    n_features: int,
    triggers: Sequence[int],
    gate: str,
    *,
    k: int = 6,
    space: str = "logit",
    method: str = "sii",
    n_coalitions: int = 512,
    seed: int = 0,
) -> GateRecovery:
    """A3.5: first-order attributions (S1-SHAP for 'logit', KernelSHAP for 'prob'), top-k, 2^k coalitions,
    interactions in ``space``, score. ``method`` ∈ {'sii', 'archdetect', 'loo_pair', 'mean_context'}."""
    g = _game(value_fn, n_features)
    link = "logit" if space == "logit" else "identity"
    phi = kernel_shap(g, n_features, n_coalitions=n_coalitions, link=link, seed=seed).phi
    feats = top_k_features(phi, min(k, n_features))
    inter = pairwise_interactions(g, n_features, feats, space=space)
    return gate_recovery(getattr(inter, method), feats, triggers, gate)


# ----------------------------------------------------------------------------------------------
# Faithfulness and plausibility [A2.9–A2.10]
# ----------------------------------------------------------------------------------------------

ERASER_FRACTIONS = (0.01, 0.05, 0.10, 0.20, 0.50)


def k_set(m: int, fractions: Sequence[float] = ERASER_FRACTIONS, dedup: bool = True) -> list[int]:
    """⌈f·M⌉ for each fraction ('rounded up and de-duplicated'); 1e-9 guard against float error."""
    ks = [max(1, math.ceil(f * m - 1e-9)) for f in fractions]
    return sorted(set(ks)) if dedup else ks


def ranking(phi) -> np.ndarray:
    """Feature order by signed attribution, descending, ties by index [R]."""
    p = np.asarray(phi, float)
    return np.lexsort((np.arange(p.size), -p))


@dataclass(frozen=True)
class ComprehensivenessSufficiency:
    comprehensiveness: float  #: mean_k [v(1) − v(1 − top_k)]
    sufficiency: float  #: mean_k [v(1) − v(top_k only)]; lower is better, may be negative
    ks: tuple[int, ...]


def comprehensiveness_sufficiency(
    value_fn: ValueFn,
    n_features: int,
    order: Sequence[int],
    *,
    link: str = "identity",
    eps: float = CLIP_EPS,
    eraser_normalization: bool = False,
) -> ComprehensivenessSufficiency:
    """ERASER Comp/Suff averaged over the de-duplicated K set (Δp; ``link='logit'`` gives Δℓ).

    ``eraser_normalization=True``: ERASER's original Σ over the 5 bins (not de-duplicated) plus the 0%
    term (which is 0), divided by |B| + 1.
    """
    g, f = _game(value_fn, n_features), _link(link, eps)
    order = np.asarray(order, int)
    full = np.ones(n_features, bool)
    v1 = f(g(full))
    ks = k_set(n_features, dedup=not eraser_normalization)
    comp, suff = [], []
    for k in ks:
        rm = full.copy()
        rm[order[:k]] = False
        keep = ~full
        keep[order[:k]] = True
        comp.append(v1 - f(g(rm)))
        suff.append(v1 - f(g(keep)))
    if eraser_normalization:
        d = len(ks) + 1
        return ComprehensivenessSufficiency(sum(comp) / d, sum(suff) / d, tuple(ks))
    return ComprehensivenessSufficiency(float(np.mean(comp)), float(np.mean(suff)), tuple(ks))


def deletion_insertion_curves(value_fn: ValueFn, n_features: int,
                              order: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """RISE curves over j = 0..M: v(1 with top-j deleted) and v(only top-j present)."""
    g = _game(value_fn, n_features)
    order = np.asarray(order, int)
    dele, ins = [], []
    for j in range(n_features + 1):
        mk = np.ones(n_features, bool)
        mk[order[:j]] = False
        dele.append(g(mk))
        ins.append(g(~mk))
    return np.array(dele), np.array(ins)


def curve_auc(curve, method: str = "trapezoid") -> float:
    """AUC over x = j/M ∈ [0, 1] by the trapezoid rule [R], or the mean of the M + 1 points."""
    c = np.asarray(curve, float)
    if method == "trapezoid":
        return float(np.trapezoid(c, np.linspace(0.0, 1.0, c.size)))
    if method == "mean":
        return float(c.mean())
    raise SiftError(f"method must be 'trapezoid' or 'mean', got {method!r}")


def precision_at_g(phi, ground_truth: Sequence[int]) -> float:
    """|top-g ∩ GT| / g with g = |GT| (Flag/Human prec.@g, planted-trigger Prec@g)."""
    gt = set(int(i) for i in ground_truth)
    top = ranking(phi)[: len(gt)]
    return len(gt.intersection(top.tolist())) / len(gt)


def mass_share(phi, ground_truth: Sequence[int]) -> float:
    """Σ_{i∈GT} max(φ_i, 0) / Σ_i max(φ_i, 0)."""
    p = np.maximum(np.asarray(phi, float), 0.0)
    tot = p.sum()
    return float(p[list(ground_truth)].sum() / tot) if tot > 0 else float("nan")


def boolean_gate_game(
    n_features: int, triggers: Sequence[int], gate: str, p0: float = 0.01, p1: float = 0.99
) -> ValueFn:
    """Planted-rule toy game: v(S) = p1 if the OR/AND gate over ``triggers`` fires on S, else p0."""
    t = list(triggers)
    agg = {"OR": np.any, "AND": np.all}[gate.upper()]
    return lambda mask: p1 if agg(np.asarray(mask, bool)[t]) else p0


def logit_additive_game(intercept: float, weights: Sequence[float]) -> ValueFn:
    """p(z) = σ(b + w·z): S1-SHAP recovers w exactly."""
    w = np.asarray(weights, float)
    return lambda mask: float(1.0 / (1.0 + np.exp(-(intercept + w @ np.asarray(mask, float)))))
