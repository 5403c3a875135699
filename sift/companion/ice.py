"""ICE: Intervention-Consistent Explanation evaluation (paper 000; spec ``ice-and-judge-metrics.md`` Part A).

An explanation's top-q units (tokens or CoT steps) are kept, an operator (deletion, retrieval infill)
is applied to the rest, and the retained score is compared with M equal-size random unit sets.

Conventions (spec tags in brackets):
* comparisons use the raw retained score s(x_o^r) [R, A2.3]; NSR (Eq. 1) is reported for magnitude.
  Both orderings agree whenever s(x) − s(∅) > 0.
* the strict win rate (Alg. 1 l.6) counts ties as losses [P]; the mid-rank WR and tie rate are reported too [R].
* p = (1 + #{null ≥ obs}) / (M_valid + 1) [P, with the valid-draw count R].
* d_null uses the population SD (ddof=0) [C]; σ = 0 → NaN and ``degenerate_null`` [R].
* d_null is computed on raw scores; it equals d on NSR because NSR is a positive affine map of s
  (when s(x) − s(∅) > 0 and NSR is not clipped).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from sift.companion._stats import BootstrapCI, benjamini_hochberg, bootstrap_mean_ci
from sift.errors import SiftError

Operator = Callable[[Sequence, np.ndarray], list]
"""An operator maps (units, keep_mask) to the intervened unit list; kept units are never altered."""

# ----------------------------------------------------------------------------------------------
# Operators
# ----------------------------------------------------------------------------------------------

#: Label blacklist of the reference code [C, A3.7]; expanded to spacing/case variants by ``expand_blacklist``.
LABEL_BLACKLIST: tuple[str, ...] = (
    "positive", "negative", "Positive", "Negative", "entailment", "neutral", "contradiction",
    "true", "false", "yes", "no",
)
#: Optional "sentiment scrub" additions [C].
SENTIMENT_SCRUB: tuple[str, ...] = (
    "amazing", "terrible", "great", "awful", "excellent", "horrible", "wonderful", "bad", "good",
    "best", "worst", "love", "hate",
)


def expand_blacklist(words: Sequence[str]) -> frozenset[str]:
    """All variants of ``words`` with/without a leading space (also 'Ġ'), lower-cased and capitalised."""
    out: set[str] = set()
    for w in words:
        base = w.strip()
        for v in {base, base.lower(), base.capitalize()}:
            out.update({v, " " + v, "Ġ" + v})
    return frozenset(out)


def delete(units: Sequence, keep_mask: np.ndarray) -> list:
    """Deletion operator [P §3.3]: keep only the kept units, in their original order."""
    keep = _mask(keep_mask, len(units))
    return [u for u, k in zip(units, keep) if k]


def step_delete(steps: Sequence[str], selected: np.ndarray) -> list[str]:
    """Step-Delete(S) [P App. M]: remove the selected steps, concatenate the rest in order."""
    return delete(steps, ~_mask(selected, len(steps)))


def step_retain(steps: Sequence[str], selected: np.ndarray) -> list[str]:
    """Step-Retain(S) [P App. M]: keep only the selected steps, in order."""
    return delete(steps, _mask(selected, len(steps)))


def build_retrieval_pool(
    corpus: Mapping[Hashable, Sequence],
    exclude_id: Hashable,
    *,
    blacklist: frozenset | set | Sequence = (),
    special: Sequence = (),
) -> tuple:
    """Leave-one-out filler pool [P §3.3, C]: units of every *other* example, minus blacklisted/special ones.

    Raises if the pool ends up empty (spec edge case).
    """
    banned = set(blacklist) | set(special)
    pool = tuple(u for ex_id, units in corpus.items() if ex_id != exclude_id for u in units if u not in banned)
    if not pool:
        raise SiftError(f"retrieval pool for example {exclude_id!r} is empty after leave-one-out filtering")
    return pool


def retrieval_infill(
    units: Sequence, keep_mask: np.ndarray, pool: Sequence, rng: np.random.Generator
) -> list:
    """Retrieval infill [P §3.3, C]: replace every non-kept unit by a pool unit; length is preserved.

    Sampling is without replacement within a call, with replacement if the pool is too small [C].
    """
    keep = _mask(keep_mask, len(units))
    n_fill = int((~keep).sum())
    if n_fill and len(pool) == 0:
        raise SiftError("retrieval_infill: empty filler pool")
    fill_idx = rng.choice(len(pool), size=n_fill, replace=n_fill > len(pool)) if n_fill else []
    it = iter(fill_idx)
    return [u if k else pool[int(next(it))] for u, k in zip(units, keep)]


class RetrievalInfill:
    """Seeded retrieval-infill operator with a caller-supplied filler pool (fresh draw per call)."""

    def __init__(self, pool: Sequence, seed: int = 0):
        if len(pool) == 0:
            raise SiftError("RetrievalInfill: empty filler pool")
        self.pool = tuple(pool)
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    def __call__(self, units: Sequence, keep_mask: np.ndarray) -> list:
        return retrieval_infill(units, keep_mask, self.pool, self._rng)


def split_cot_steps(text: str) -> list[str]:
    """Split a CoT into steps: non-empty lines, each further split into sentences [P App. M: steps = sentences]."""
    steps: list[str] = []
    for line in text.splitlines():
        for s in re.split(r"(?<=[.!?])\s+(?=[A-Z0-9(])", line.strip()):
            if s.strip():
                steps.append(s.strip())
    return steps


# ----------------------------------------------------------------------------------------------
# Rationales and null sets
# ----------------------------------------------------------------------------------------------


def rationale_size(n: int, k: float = 0.2) -> int:
    """q = max(1, ⌊k·n⌋) [C]; a 1e-9 guard stops float error (0.29·100 = 28.999…) from dropping a unit."""
    return max(1, int(math.floor(k * n + 1e-9)))


def top_k_rationale(scores, k: float = 0.2, valid_mask: np.ndarray | None = None) -> np.ndarray:
    """Positions of the top q valid units by score (ties → earlier position), returned sorted."""
    s = np.asarray(scores, dtype=float)
    valid = np.ones(s.size, bool) if valid_mask is None else _mask(valid_mask, s.size)
    pos = np.flatnonzero(valid)
    if pos.size == 0:
        raise SiftError("top_k_rationale: no valid positions (empty rationale)")
    q = rationale_size(pos.size, k)
    order = np.lexsort((pos, -s[pos]))  # primary: descending score, secondary: position
    return np.sort(pos[order[:q]])


def sample_null_sets(
    valid_positions: Sequence[int], q: int, n_sets: int | None, rng: np.random.Generator
) -> np.ndarray:
    """Random equal-size sets [P Alg. 1]: each drawn uniformly without replacement; draws independent.

    ``n_sets=None`` enumerates all C(n, q) sets (exact expectation). Returns an (M, q) array of
    sorted positions.
    """
    pos = np.asarray(valid_positions, dtype=int)
    if n_sets is None:
        return np.array(list(combinations(pos.tolist(), q)), dtype=int).reshape(-1, q)
    return np.array([np.sort(rng.choice(pos, size=q, replace=False)) for _ in range(n_sets)], dtype=int).reshape(-1, q)


# ----------------------------------------------------------------------------------------------
# Per-example statistics
# ----------------------------------------------------------------------------------------------


#: NSR is undefined when |s(x) − s(∅)| is below this (the ICE code's threshold) [C]
NSR_MIN_DENOMINATOR = 0.05


def normalized_score_retention(
    s_kept: float,
    s_full: float,
    s_empty: float,
    *,
    min_denominator: float = NSR_MIN_DENOMINATOR,
    clip: float = 2.0,
    undefined: float = 0.0,
) -> float:
    """NSR = (s(x_o^r) − s(∅)) / (s(x) − s(∅)) [P Eq. 1], clipped to [−clip, clip] [C].

    Returns ``undefined`` (0.0 as in the code [C]; pass NaN to flag instead) when |s(x) − s(∅)| < min_denominator.
    """
    den = s_full - s_empty
    if abs(den) < min_denominator:
        return float(undefined)
    return float(np.clip((s_kept - s_empty) / den, -clip, clip))


@dataclass(frozen=True)
class WinRateResult:
    """Per-example ICE statistics against a null of equal-size random sets (Alg. 1)."""

    observed: float
    win_rate: float  #: strict: mean 1[obs > null_i]  (ties lose) [P]
    midrank_win_rate: float  #: (wins + ½ ties)/M [R]
    tie_rate: float
    p_value: float  #: (1 + #{null ≥ obs}) / (M + 1) [P]
    d_null: float  #: (obs − μ)/σ, σ with ddof=0; NaN if σ = 0
    null_mean: float
    null_std: float
    n_null: int  #: valid (non-NaN) draws
    degenerate_null: bool

    @property
    def valid(self) -> bool:
        return self.n_null > 0 and not math.isnan(self.win_rate)


def win_rate_test(observed: float, null, *, min_valid: int = 10) -> WinRateResult:
    """Strict / mid-rank win rate, one-sided permutation p-value and d_null [P Alg. 1, §3.2].

    NaN null draws are dropped; with fewer than ``min_valid`` valid draws (or a NaN observation) all
    statistics are NaN [C].
    """
    nul = np.asarray(null, dtype=float).ravel()
    nul = nul[~np.isnan(nul)]
    m = nul.size
    if m < min_valid or math.isnan(observed):
        nan = float("nan")
        return WinRateResult(float(observed), nan, nan, nan, nan, nan, nan, nan, m, False)
    wins = int((observed > nul).sum())
    ties = int((observed == nul).sum())
    ge = int((nul >= observed).sum())
    mu, sd = float(nul.mean()), float(nul.std(ddof=0))
    degenerate = sd == 0.0
    d = float("nan") if degenerate else (observed - mu) / sd
    return WinRateResult(
        observed=float(observed),
        win_rate=wins / m,
        midrank_win_rate=(wins + 0.5 * ties) / m,
        tie_rate=ties / m,
        p_value=(1 + ge) / (m + 1),
        d_null=d,
        null_mean=mu,
        null_std=sd,
        n_null=m,
        degenerate_null=degenerate,
    )


def strict_chance_level(tie_rate: float) -> float:
    """Expected strict WR of a random explanation when the null ties with probability ``tie_rate``:
    (1 − P(tie))/2 [R]."""
    return (1.0 - tie_rate) / 2.0


@dataclass(frozen=True)
class ICEExampleResult:
    """One example evaluated under one operator."""

    operator: str
    stats: WinRateResult  #: computed on raw retained scores
    nsr: float  #: NSR of the rationale (Eq. 1); ``undefined`` value when the denominator is tiny
    nsr_defined: bool  #: s(x) − s(∅) > NSR_MIN_DENOMINATOR
    s_full: float
    s_empty: float
    rationale: tuple[int, ...]
    q: int
    n_valid_units: int
    n_unique_null_sets: int


def batched(score_one: Callable[[list], float]) -> Callable[[list[list]], np.ndarray]:
    """A batch scorer (what :func:`ice_example` takes) from a per-sequence one, e.g. :func:`make_label_score_fn`'s."""
    return lambda seqs: np.array([score_one(list(u)) for u in seqs], dtype=float)


def ice_example(
    units: Sequence,
    attribution,
    score: Callable[[list[list]], np.ndarray],
    operators: Mapping[str, Operator] | Operator,
    *,
    k: float = 0.2,
    n_null: int | None = 50,
    seed: int | Sequence[int] = 0,
    valid_mask: np.ndarray | None = None,
    min_valid: int = 10,
) -> dict[str, ICEExampleResult] | None:
    """ICE on one example under one or several operators [P Alg. 1; A2.10: same null sets across operators].

    ``score(seqs) -> array`` gives s(·), the probability of the class predicted on the full input, for a batch
    of unit sequences; each operator is scored as one batch [x, ∅, op(rationale), op(null set) …], with
    ∅ = the template with empty content. Units outside ``valid_mask`` (e.g. the prompt template) are never
    selected, sampled or intervened on (content-span mode [R]). ``seed`` seeds the null sets (any
    ``numpy.random.default_rng`` seed). ``n_null=None`` enumerates all C(n, q) sets. Returns None when
    n_valid ≤ q (WR undefined) [R].
    """
    n = len(units)
    scores = np.asarray(attribution, dtype=float)
    if scores.size != n:
        raise SiftError(f"attribution has {scores.size} scores for {n} units")
    valid = np.ones(n, bool) if valid_mask is None else _mask(valid_mask, n)
    pos = np.flatnonzero(valid)
    if pos.size == 0:
        raise SiftError("ice_example: no valid units (empty rationale)")
    q = rationale_size(pos.size, k)
    if pos.size <= q:
        return None
    rationale = top_k_rationale(scores, k, valid)
    null_sets = sample_null_sets(pos, q, n_null, np.random.default_rng(seed))
    n_unique = len({tuple(s) for s in null_sets.tolist()})
    ops = operators if isinstance(operators, Mapping) else {getattr(operators, "__name__", "operator"): operators}
    units = list(units)
    empty = delete(units, ~valid)

    def keep_for(sel: np.ndarray) -> np.ndarray:
        keep = ~valid
        keep[np.asarray(sel, int)] = True
        return keep

    out: dict[str, ICEExampleResult] = {}
    for name, op in ops.items():
        seqs = [units, empty, op(units, keep_for(rationale))] + [op(units, keep_for(s)) for s in null_sets]
        sc = np.asarray(score(seqs))
        if sc.shape != (len(seqs),):
            raise SiftError(f"ice_example: score returned shape {sc.shape} for {len(seqs)} sequences")
        s_x, s_0, obs, nul = float(sc[0]), float(sc[1]), float(sc[2]), sc[3:]
        out[name] = ICEExampleResult(
            operator=name,
            stats=win_rate_test(obs, nul, min_valid=min_valid),
            nsr=normalized_score_retention(obs, s_x, s_0),
            nsr_defined=(s_x - s_0) > NSR_MIN_DENOMINATOR,
            s_full=s_x,
            s_empty=s_0,
            rationale=tuple(int(i) for i in rationale),
            q=q,
            n_valid_units=int(pos.size),
            n_unique_null_sets=n_unique,
        )
    return out


# ----------------------------------------------------------------------------------------------
# Dataset level
# ----------------------------------------------------------------------------------------------

TAXONOMY = ("anti-faithful", "near-random", "weakly faithful", "faithful")


def ice_taxonomy(win_rate: float) -> str:
    """ICE classes [P §3.4] with our boundary rule (Table 18 consistent): AF <.50 ≤ NR <.55 ≤ WF ≤ .60 < F."""
    if win_rate < 0.50:
        return "anti-faithful"
    if win_rate < 0.55:
        return "near-random"
    if win_rate <= 0.60:
        return "weakly faithful"
    return "faithful"


@dataclass(frozen=True)
class AntiFaithfulness:
    """Anti-faithfulness verdict with the tie caveat of A2.3."""

    anti_faithful: bool  #: strict WR < 0.50 [P]
    strongly_anti_faithful: bool  #: strict WR < 0.40 (figures) [P]
    tie_confounded: bool  #: strict WR < 0.50 but mid-rank WR ≥ 0.50: ties, not evidence [R]


def anti_faithfulness_flag(win_rate: float, midrank_win_rate: float | None = None) -> AntiFaithfulness:
    """Flag anti-faithfulness; with the mid-rank WR, also say whether the verdict is only an artifact of ties."""
    af = win_rate < 0.50
    conf = bool(af and midrank_win_rate is not None and midrank_win_rate >= 0.50)
    return AntiFaithfulness(af, win_rate < 0.40, conf)


@dataclass(frozen=True)
class ICEDatasetSummary:
    """One configuration (model × dataset × explainer × operator) [P §3.4, Eq. 2]."""

    n_examples: int
    win_rate: BootstrapCI  #: mean strict WR with percentile bootstrap CI
    midrank_win_rate: float
    tie_rate: float
    mean_d_null: float  #: mean of finite d with |d| < 100 [C]
    sig_rate_bh: float  #: fraction rejected by BH at α [P]
    sig_rate_raw: float  #: fraction with raw p < α (reference LLM script) [C]
    alpha: float
    taxonomy: str
    anti_faithfulness: AntiFaithfulness


def ice_summary(
    results: Sequence[WinRateResult | ICEExampleResult | None],
    *,
    n_resamples: int = 200,
    seed: int = 0,
    alpha: float = 0.10,
    groups: Sequence[str] | None = None,
) -> ICEDatasetSummary:
    """Aggregate per-example results: mean WR, bootstrap CI (B=200 [P]), BH significance rate at α=0.10 [P].

    The CI resamples examples, or whole clusters of them with ``groups`` (one per result, e.g. the base item of
    each trace: several traces of one item are not independent). Note the p-value granularity (A2.7):
    p ∈ {j/(M+1)}, so BH Sig. Rates tend to be 0% or large.
    """
    if groups is not None and len(groups) != len(results):
        raise SiftError(f"ice_summary: {len(groups)} groups for {len(results)} results")
    keep = [(r.stats if isinstance(r, ICEExampleResult) else r, None if groups is None else groups[i])
            for i, r in enumerate(results) if r is not None]
    keep = [(r, g) for r, g in keep if r.valid]
    rs = [r for r, _ in keep]
    units = None if groups is None else [g for _, g in keep]
    if not rs:
        raise SiftError("ice_summary: no valid examples")
    wr = np.array([r.win_rate for r in rs])
    mid = np.array([r.midrank_win_rate for r in rs])
    ties = np.array([r.tie_rate for r in rs])
    d = np.array([r.d_null for r in rs])
    d = d[np.isfinite(d) & (np.abs(d) < 100)]
    p = np.array([r.p_value for r in rs])
    bh = benjamini_hochberg(p, alpha)
    ci = bootstrap_mean_ci(wr, n_resamples=n_resamples, seed=seed, groups=units)
    return ICEDatasetSummary(
        n_examples=len(rs),
        win_rate=ci,
        midrank_win_rate=float(mid.mean()),
        tie_rate=float(ties.mean()),
        mean_d_null=float(d.mean()) if d.size else float("nan"),
        sig_rate_bh=bh.rejection_rate,
        sig_rate_raw=float(np.mean(p < alpha)),
        alpha=alpha,
        taxonomy=ice_taxonomy(ci.estimate),
        anti_faithfulness=anti_faithfulness_flag(ci.estimate, float(mid.mean())),
    )


@dataclass(frozen=True)
class OperatorGap:
    """Operator dependence of one configuration [P §5]."""

    gap: float  #: WR_a − WR_b (e.g. deletion − retrieval)
    crossing: bool  #: (WR_a ≥ thr) ≠ (WR_b ≥ thr)
    agree: bool  #: same taxonomy class [R]
    class_a: str
    class_b: str


def operator_gap(wr_a: float, wr_b: float, threshold: float = 0.55) -> OperatorGap:
    """Gap, threshold crossing at 55% ('positive evidence') and class agreement between two operators."""
    ca, cb = ice_taxonomy(wr_a), ice_taxonomy(wr_b)
    return OperatorGap(wr_a - wr_b, (wr_a >= threshold) != (wr_b >= threshold), ca == cb, ca, cb)


@dataclass(frozen=True)
class OperatorComparison:
    """Operator dependence over a grid of configurations (Table 19 style)."""

    n_configs: int
    n_crossings: int
    max_abs_gap: float
    n_a_greater: int
    frac_a_greater: float
    median_gap: float
    mean_gap: float


def compare_operators(wr_a, wr_b, threshold: float = 0.55) -> OperatorComparison:
    """Summarise WR_a − WR_b over matching configurations (any shape; flattened)."""
    a = np.asarray(wr_a, dtype=float).ravel()
    b = np.asarray(wr_b, dtype=float).ravel()
    if a.shape != b.shape:
        raise SiftError(f"compare_operators: shapes differ {a.shape} vs {b.shape}")
    g = a - b
    return OperatorComparison(
        n_configs=a.size,
        n_crossings=int(((a >= threshold) != (b >= threshold)).sum()),
        max_abs_gap=float(np.abs(g).max()),
        n_a_greater=int((g > 0).sum()),
        frac_a_greater=float((g > 0).mean()),
        median_gap=float(np.median(g)),
        mean_gap=float(g.mean()),
    )


def auc_over_k(k_grid: Sequence[float], nsr_values: Sequence[float]) -> float:
    """'AUC-Suf' [C]: trapezoid rule of NSR over the k grid (record the grid; the paper does not state it)."""
    return float(np.trapezoid(np.asarray(nsr_values, float), np.asarray(k_grid, float)))


def retrieval_contamination_rate(n_label_like: int, vocab_size: int = 50_000, n_draws: int = 4) -> float:
    """Chance that infill re-inserts a surviving label-like token [P §6.4]: 1 − (1 − s/V)^draws."""
    return 1.0 - (1.0 - n_label_like / vocab_size) ** n_draws


# ----------------------------------------------------------------------------------------------
# Step-level CoT (App. M)
# ----------------------------------------------------------------------------------------------


def src_taxonomy(src: float) -> str:
    """App. M: genuine > 0.4; scaffolding 0.15–0.4; decorative < 0.15."""
    if src > 0.4:
        return "genuine"
    if src >= 0.15:
        return "scaffolding"
    return "decorative"


@dataclass(frozen=True)
class StepNecSuf:
    """Step-level necessity / sufficiency of one CoT and SRC = Nec·(1 − Suf) [P App. M; R operationalisation]."""

    necessity: float  #: mean 1[answer(Delete(S)) ≠ a]
    sufficiency: float  #: mean 1[answer(Retain(S)) = a]
    src: float
    taxonomy: str
    q: int
    n_subsets: int


def step_necessity_sufficiency(
    steps: Sequence[str],
    answer_fn: Callable[[list[str]], Hashable],
    *,
    reference_answer: Hashable | None = None,
    k: float = 0.2,
    n_subsets: int | None = 20,
    seed: int = 0,
    valid_mask: np.ndarray | None = None,
) -> StepNecSuf:
    """Nec_k and Suf_k over random step subsets of size q = max(1, ⌊k·n⌋) (``n_subsets=None``: all subsets).

    ``answer_fn(steps) -> answer`` re-queries the model with the modified CoT ("…Therefore the answer is").
    ``valid_mask`` excludes e.g. the final-answer sentence from the step pool [R].
    """
    n = len(steps)
    valid = np.ones(n, bool) if valid_mask is None else _mask(valid_mask, n)
    pos = np.flatnonzero(valid)
    q = rationale_size(pos.size, k)
    a = answer_fn(list(steps)) if reference_answer is None else reference_answer
    sets = sample_null_sets(pos, q, n_subsets, np.random.default_rng(seed))
    nec, suf = [], []
    for s in sets:
        sel = np.zeros(n, bool)
        sel[s] = True
        nec.append(answer_fn(step_delete(steps, sel)) != a)
        suf.append(answer_fn(step_retain(steps, sel)) == a)
    ne, su = float(np.mean(nec)), float(np.mean(suf))
    src = ne * (1 - su)
    return StepNecSuf(ne, su, src, src_taxonomy(src), q, len(sets))


@dataclass(frozen=True)
class StepICEResult:
    """ICE-style step win rates of an attributed step set R [R, A2.15]."""

    necessity: WinRateResult  #: Δ(R) = s(C) − s(Delete(R)) vs Δ(S_i)
    sufficiency: WinRateResult  #: s(Retain(R)) vs s(Retain(S_i))
    rationale: tuple[int, ...]
    q: int


def step_ice(
    steps: Sequence[str],
    step_scores,
    score_fn: Callable[[list[str]], float],
    *,
    k: float = 0.2,
    n_null: int | None = 50,
    seed: int = 0,
    valid_mask: np.ndarray | None = None,
    min_valid: int = 10,
) -> StepICEResult | None:
    """Step-level ICE for step attributions (e.g. SIFT's) under Step-Delete and Step-Retain.

    ``score_fn(steps)`` is P(a | question, modified CoT), or the 0/1 answer match when no log-probs
    exist — then read the mid-rank WR, because ties dominate. Returns None when n_valid ≤ q.
    """
    n = len(steps)
    valid = np.ones(n, bool) if valid_mask is None else _mask(valid_mask, n)
    pos = np.flatnonzero(valid)
    q = rationale_size(pos.size, k)
    if pos.size <= q:
        return None
    r = top_k_rationale(step_scores, k, valid)
    sets = sample_null_sets(pos, q, n_null, np.random.default_rng(seed))
    s_c = float(score_fn(list(steps)))

    def sel(idx) -> np.ndarray:
        m = np.zeros(n, bool)
        m[idx] = True
        return m

    nec_obs = s_c - float(score_fn(step_delete(steps, sel(r))))
    nec_null = [s_c - float(score_fn(step_delete(steps, sel(s)))) for s in sets]
    suf_obs = float(score_fn(step_retain(steps, sel(r))))
    suf_null = [float(score_fn(step_retain(steps, sel(s)))) for s in sets]
    return StepICEResult(
        win_rate_test(nec_obs, nec_null, min_valid=min_valid),
        win_rate_test(suf_obs, suf_null, min_valid=min_valid),
        tuple(int(i) for i in r),
        q,
    )


# ----------------------------------------------------------------------------------------------
# Token attributions for HF causal LMs (white-box extractors, A3.3)
# ----------------------------------------------------------------------------------------------


def _as_ids(input_ids):
    import torch

    t = torch.as_tensor(input_ids, dtype=torch.long)
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2 or t.shape[0] != 1:
        raise SiftError(f"expected one sequence of token ids, got shape {tuple(t.shape)}")
    return t


def attention_attribution(model, input_ids) -> np.ndarray:
    """Attention from the last (prediction) position to every token, averaged over all layers and heads [P, C].

    Read with :func:`sift.lm.states.capture` (the model keeps its own attention kernel; the weights are its
    eager formula on the same queries and keys). The scores sum to 1 (each attention row is a softmax).
    """
    import torch

    from sift.lm.states import capture, find_blocks

    ids = _as_ids(input_ids).to(next(model.parameters()).device)
    layers = range(len(find_blocks(model)))
    with torch.no_grad(), capture(model, attention=layers, q_start=ids.shape[1] - 1) as cap:
        model(input_ids=ids)
    if len(cap.attention) != len(layers):
        raise SiftError(f"{type(model).__name__}: its attention does not go through transformers' "
                        f"AttentionInterface; attention attribution cannot read its weights")
    att = torch.stack([cap.attention[i][0, -1, :] for i in layers])  # (layers, n), averaged over heads
    return att.mean(dim=0).double().cpu().numpy()


GRADIENT_METHODS = ("grad_x_input", "grad_x_input_norm", "grad_norm")


def gradient_attribution(model, input_ids, target_token_id: int, method: str = "grad_x_input") -> np.ndarray:
    """Gradient attributions of the last-position logit of ``target_token_id`` w.r.t. the input embeddings.

    * ``grad_x_input``: Σ_h g·e (signed gradient × input, summed over the hidden dim);
    * ``grad_x_input_norm``: ‖g ⊙ e‖₂;
    * ``grad_norm``: ‖g‖₂, the ICE reference extractor [C].
    ``target_token_id`` must be the *label token's vocabulary id*, not a class index (the reference
    ``run_ice_llm.py`` passes the class index: a code defect the spec tells us not to copy).
    """
    import torch

    if method not in GRADIENT_METHODS:
        raise SiftError(f"gradient_attribution: method must be one of {GRADIENT_METHODS}, got {method!r}")
    ids = _as_ids(input_ids).to(next(model.parameters()).device)
    emb_layer = model.get_input_embeddings()
    with torch.enable_grad():
        emb = emb_layer(ids).detach().requires_grad_(True)
        logit = model(inputs_embeds=emb).logits[0, -1, int(target_token_id)]
        (g,) = torch.autograd.grad(logit, emb)
    g, e = g[0], emb.detach()[0]
    if method == "grad_x_input":
        a = (g * e).sum(-1)
    elif method == "grad_x_input_norm":
        a = (g * e).norm(dim=-1)
    else:
        a = g.norm(dim=-1)
    return a.double().cpu().numpy()


def label_token_ids(tokenizer, label_words: Sequence[str]) -> list[int]:
    """First sub-token id of each label word (pass the words with their leading space, e.g. ' positive') [C]."""
    ids = []
    for w in label_words:
        enc = tokenizer.encode(w, add_special_tokens=False)
        if not enc:
            raise SiftError(f"label word {w!r} encodes to no tokens")
        ids.append(int(enc[0]))
    return ids


def label_probabilities(model, input_ids, label_ids: Sequence[int]) -> np.ndarray:
    """Softmax over the label tokens' last-position logits (restricted label set) [C, A2.1]."""
    import torch

    ids = _as_ids(input_ids).to(next(model.parameters()).device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1, list(label_ids)]
    return torch.softmax(logits.double(), -1).cpu().numpy()


def make_label_score_fn(
    model,
    label_ids: Sequence[int],
    *,
    prefix_ids: Sequence[int] = (),
    suffix_ids: Sequence[int] = (),
    predicted_index: int | None = None,
) -> Callable[[Sequence[int]], float]:
    """s(·) for ICE on a causal LM: p[pred] of the restricted label softmax on prefix + content + suffix.

    ``predicted_index`` fixes the class; by default it is the argmax on the first call (the full input).
    ``fn([])`` is then s(∅) = the template with empty content [P].
    """
    state = {"pred": predicted_index}

    def fn(content_ids: Sequence[int]) -> float:
        ids = list(prefix_ids) + [int(i) for i in content_ids] + list(suffix_ids)
        if not ids:
            raise SiftError("make_label_score_fn: empty input (give a prefix or suffix template)")
        p = label_probabilities(model, ids, label_ids)
        if state["pred"] is None:
            state["pred"] = int(np.argmax(p))
        return float(p[state["pred"]])

    return fn


@dataclass(frozen=True)
class EncodedSteps:
    """Token ids of prefix + steps + suffix, with each step's half-open token span."""

    input_ids: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]


def encode_steps(tokenizer, steps: Sequence[str], *, prefix: str = "", suffix: str = "",
                 sep: str = " ") -> EncodedSteps:
    """Tokenise piecewise (prefix, sep+step…, suffix) so step spans are exact; uses ``tokenizer.encode``."""
    ids: list[int] = []
    spans: list[tuple[int, int]] = []
    if prefix:
        ids += tokenizer.encode(prefix, add_special_tokens=False)
    for i, s in enumerate(steps):
        piece = (sep if (i or prefix) else "") + s
        start = len(ids)
        ids += tokenizer.encode(piece, add_special_tokens=False)
        spans.append((start, len(ids)))
    if suffix:
        ids += tokenizer.encode(suffix, add_special_tokens=False)
    return EncodedSteps(tuple(int(i) for i in ids), tuple(spans))


def pool_step_scores(token_scores, spans: Sequence[tuple[int, int]], reduce: str = "sum") -> np.ndarray:
    """Aggregate token attributions into step scores ('sum', 'mean' or 'max' over each span)."""
    t = np.asarray(token_scores, dtype=float)
    f = {"sum": np.sum, "mean": np.mean, "max": np.max}[reduce]
    return np.array([f(t[a:b]) if b > a else 0.0 for a, b in spans])


def step_attribution(
    model,
    tokenizer,
    steps: Sequence[str],
    *,
    method: str = "attention",
    target_token_id: int | None = None,
    prefix: str = "",
    suffix: str = "",
    reduce: str = "sum",
) -> np.ndarray:
    """Step-level variant: token attributions (attention or a gradient method) pooled over each CoT step."""
    enc = encode_steps(tokenizer, steps, prefix=prefix, suffix=suffix)
    if method == "attention":
        tok = attention_attribution(model, list(enc.input_ids))
    else:
        if target_token_id is None:
            raise SiftError("step_attribution: gradient methods need target_token_id")
        tok = gradient_attribution(model, list(enc.input_ids), target_token_id, method)
    return pool_step_scores(tok, enc.spans, reduce)


# ----------------------------------------------------------------------------------------------


def _mask(mask, n: int) -> np.ndarray:
    m = np.asarray(mask, dtype=bool).ravel()
    if m.size != n:
        raise SiftError(f"mask has {m.size} entries for {n} units")
    return m.copy()
