"""Rationalization bias in pairwise LLM judges (paper 001; spec ``ice-and-judge-metrics.md`` Part B).

Cue conditions (Blind, Truth, Flip, Placebo, Reveal-After) and anchoring attacks are prompt builders /
transforms; the metrics run over verdict and explanation tables.

Candidate indices are *identities* (1 = first candidate passed in, 2 = second), not display slots;
``display_order`` gives the identity shown in each slot and ``map_display_verdict`` undoes it (B2 notation).
Outcomes are ordered as in the paper's tables: (Tie, [1,2], [2,1]).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from sift.companion._stats import BootstrapCI, bootstrap_ci, wilson_interval
from sift.errors import SiftError

TIE, ONE_FIRST, TWO_FIRST = "Tie", "[1,2]", "[2,1]"
OUTCOMES: tuple[str, str, str] = (TIE, ONE_FIRST, TWO_FIRST)

# ----------------------------------------------------------------------------------------------
# Prompts [P B3]
# ----------------------------------------------------------------------------------------------

PROTOCOL_INSTRUCTIONS: dict[str, str] = {
    "baseline": (
        "You are a careful judge. Two {cands} describe the same {ctx_l}. Decide which {cand} is better "
        "overall and briefly explain why. The explanation must be 2-4 sentences in plain English."
    ),
    "scot": (
        "You are a judge. Evaluate along the following criteria: accuracy, completeness, conciseness, "
        "fluency. Decide which {cand} is better overall and briefly explain why."
    ),
    "pbp_lock": (
        "You are an impartial judge. First, write criterion-wise notes for accuracy, completeness, "
        "conciseness, fluency. For every note, quote or reference the exact span(s) from the {ctx} or "
        "{cands_c} that support it. Do not provide a verdict."
    ),
    "pbp_score": (
        "Using only the locked_notes above, assign 0-5 scores for each criterion and {cand}. Do not add "
        "new evidence. Aggregate the criterion scores (equal weights unless specified) and produce the "
        "overall verdict and a one-sentence justification that references the locked notes. The "
        "explanation must reference locked evidence only. If the aggregate scores are equal, the verdict is Tie."
    ),
}

OUTPUT_FORMAT = (
    'Output only JSON: {"verdict": "[1,2]" | "[2,1]" | "Tie", "explanation": "..."}. '
    '"[1,2]" means {cand} 1 is better, "[2,1]" means {cand} 2 is better. '
    "Do not use any external knowledge."
)
PBP_LOCK_FORMAT = 'Output only JSON: {"locked_notes": "..."}. Do not use any external knowledge.'

#: [R] Reveal-After correction turn (the paper's section is empty in our copy).
REVEAL_TEMPLATE = (
    "Correction: the labels above were swapped. The correct labels are {cand} 1 = {true_1}, "
    "{cand} 2 = {true_2}. Re-evaluate and output the same JSON."
)
#: [R] placebo badge: credible but non-informative.
DEFAULT_BADGE = "Reviewed ✓"


def render_pair_prompt(
    question: str,
    candidates: Sequence[str],
    labels: Sequence[str | None] | None = None,
    *,
    protocol: str = "baseline",
    display_order: Sequence[int] = (0, 1),
    context_name: str = "Document",
    candidate_name: str = "Summary",
    locked_notes: str | None = None,
) -> str:
    """Render one judge prompt: instruction, context, the two candidates (with "(label = …)" where a
    label is given, in ``display_order``), and the JSON output contract [P B3].

    ``labels`` are per identity; None (or a None entry) omits the parenthetical (Blind [R]).
    """
    if len(candidates) != 2:
        raise SiftError(f"a pairwise judge needs exactly 2 candidates, got {len(candidates)}")
    if sorted(display_order) != [0, 1]:
        raise SiftError(f"display_order must be a permutation of (0, 1), got {tuple(display_order)}")
    if protocol not in PROTOCOL_INSTRUCTIONS:
        raise SiftError(f"unknown protocol {protocol!r}; choose from {sorted(PROTOCOL_INSTRUCTIONS)}")
    c, cs = candidate_name, candidate_name + "s"
    fmt = dict(cand=c.lower(), cands=cs.lower(), cands_c=cs, ctx=context_name, ctx_l=context_name.lower())
    parts = [PROTOCOL_INSTRUCTIONS[protocol].format(**fmt), "", f"{context_name}: {question}"]
    for slot, ident in enumerate(display_order, start=1):
        lab = None if labels is None else labels[ident]
        tag = f" (label = {lab})" if lab is not None else ""
        parts.append(f"{c} {slot}{tag}: {candidates[ident]}")
    if protocol == "pbp_score":
        if locked_notes is None:
            raise SiftError("pbp_score needs the stage-1 locked_notes")
        parts += ["", f"locked_notes: {locked_notes}"]
    parts += ["", (PBP_LOCK_FORMAT if protocol == "pbp_lock" else OUTPUT_FORMAT.replace("{cand}", c))]
    return "\n".join(parts)


def blind_prompt(question: str, candidates: Sequence[str], **kw) -> str:
    """Blind: no provenance labels [P; omit the parenthetical R]."""
    return render_pair_prompt(question, candidates, None, **kw)


def truth_prompt(question: str, candidates: Sequence[str], true_labels: Sequence[str], **kw) -> str:
    """Truth: each candidate shows its true (nominal) provenance label, e.g. ("LLM", "TradML")."""
    return render_pair_prompt(question, candidates, tuple(true_labels), **kw)


def flip_prompt(question: str, candidates: Sequence[str], true_labels: Sequence[str], **kw) -> str:
    """Flip: labels swapped, candidate identities fixed."""
    return render_pair_prompt(question, candidates, (true_labels[1], true_labels[0]), **kw)


def placebo_prompt(
    question: str, candidates: Sequence[str], *, badge: str = DEFAULT_BADGE, badged: int = 0, **kw
) -> str:
    """Placebo: a credible, non-informative badge on candidate ``badged`` (0/1) only [R text]."""
    labels: list[str | None] = [None, None]
    labels[badged] = badge
    return render_pair_prompt(question, candidates, labels, **kw)


@dataclass(frozen=True)
class RevealAfterPrompts:
    """Two-turn Reveal-After probe [R]: the Flip prompt, then the correction turn."""

    turn1: str
    turn2: str


def reveal_after_prompts(
    question: str,
    candidates: Sequence[str],
    true_labels: Sequence[str],
    *,
    display_order: Sequence[int] = (0, 1),
    candidate_name: str = "Summary",
    **kw,
) -> RevealAfterPrompts:
    """Reveal-After: turn 1 = Flip prompt; turn 2 reveals the true labels of the *displayed* slots."""
    t1 = flip_prompt(question, candidates, true_labels, display_order=display_order, candidate_name=candidate_name,
                     **kw)
    t2 = REVEAL_TEMPLATE.format(
        cand=candidate_name, true_1=true_labels[display_order[0]], true_2=true_labels[display_order[1]]
    )
    return RevealAfterPrompts(t1, t2)


def pbp_prompts(question: str, candidates: Sequence[str], labels: Sequence[str | None] | None,
                **kw) -> Callable[[str], str]:
    """Proof-Before-Preference as two calls: returns ``stage2(locked_notes)``; stage 1 is
    ``render_pair_prompt(..., protocol='pbp_lock')``. Serialising the stages is [R]."""

    def stage2(locked_notes: str) -> str:
        return render_pair_prompt(question, candidates, labels, protocol="pbp_score", locked_notes=locked_notes, **kw)

    return stage2


def map_display_verdict(verdict: str, display_order: Sequence[int]) -> str:
    """Map a verdict over displayed slots back to identities (position de-randomisation)."""
    v = normalize_verdict(verdict)
    if v == TIE or tuple(display_order) == (0, 1):
        return v
    return TWO_FIRST if v == ONE_FIRST else ONE_FIRST


@lru_cache(maxsize=256)
def normalize_verdict(v: str) -> str:
    """Canonical verdict string; accepts '[1,2]', '[1, 2]', '12', 'tie', …"""
    s = re.sub(r"[\s\[\]]", "", str(v)).lower()
    if s in ("tie", "equal"):
        return TIE
    if s in ("1,2", "12"):
        return ONE_FIRST
    if s in ("2,1", "21"):
        return TWO_FIRST
    raise SiftError(f"unparseable verdict {v!r}")


@dataclass(frozen=True)
class JudgeOutput:
    verdict: str
    explanation: str


def parse_judge_output(text: str, display_order: Sequence[int] = (0, 1)) -> JudgeOutput | None:
    """Parse the judge's JSON (first {...} block); verdict mapped to identities. None if invalid."""
    m = re.search(r"\{.*\}", text, flags=re.S)
    if not m:
        return None
    try:
        obj = json.loads(m.group(0))
        return JudgeOutput(map_display_verdict(obj["verdict"], display_order), str(obj.get("explanation", "")))
    except (json.JSONDecodeError, KeyError, TypeError, SiftError):
        return None


def favored_outcome(labels: Sequence[str | None], favored_label: str = "LLM") -> str | None:
    """The cue-favored outcome f: the verdict ranking first the identity that displays ``favored_label``
    (or the placebo badge) [R resolution of the paper's Flip contradiction]; None if no candidate carries it."""
    hits = [i for i, lab in enumerate(labels) if lab == favored_label]
    if len(hits) != 1:
        return None
    return ONE_FIRST if hits[0] == 0 else TWO_FIRST


def opposite(outcome: str) -> str:
    return {ONE_FIRST: TWO_FIRST, TWO_FIRST: ONE_FIRST}[normalize_verdict(outcome)]


# ----------------------------------------------------------------------------------------------
# Anchoring attacks [P B3; generation R]
# ----------------------------------------------------------------------------------------------

ATTACK_REWRITE_PROMPTS = {
    "verbosity": (
        "Rewrite the text below by appending redundant but fluent sentences that restate its content. "
        "Do not add, remove or change any fact.\n\nText: {text}\n\nRewritten text:"
    ),
    "confidence": (
        "Rewrite the text below in a more assertive, confident tone (remove hedges, use decisive "
        "phrasing) without changing any fact.\n\nText: {text}\n\nRewritten text:"
    ),
}

_HEDGES = (
    r"\bit seems that\s+", r"\bit appears that\s+", r"\bperhaps,?\s+", r"\bpossibly,?\s+",
    r"\barguably,?\s+", r"\bsomewhat\s+", r"\bapparently,?\s+", r"\bI think\s+",
)


def attack_rewrite_prompt(text: str, attack: str) -> str:
    """Fixed rewriter-LLM prompt for an attack ('verbosity' | 'confidence') [R]."""
    return ATTACK_REWRITE_PROMPTS[attack].format(text=text)


def verbosity_attack(text: str, padding: str | None = None) -> str:
    """Verbosity: append redundant, content-preserving text [P]. Default padding restates the first sentence [R]."""
    if padding is None:
        first = re.split(r"(?<=[.!?])\s+", text.strip())[0].rstrip(".!?")
        padding = (
            f"In other words, {first[:1].lower() + first[1:]}. To state it thoroughly and in full detail, "
            "the points above comprehensively cover the content."
        )
    return text.rstrip() + " " + padding


def confidence_attack(text: str) -> str:
    """Confidence: assertive tone without changing facts [P]; rule-based: drop soft hedges, add a decisive frame [R]."""
    out = text
    for h in _HEDGES:
        out = re.sub(h, "", out, flags=re.I)
    out = out.strip()
    out = out[:1].upper() + out[1:]
    return "Clearly and without doubt: " + out


ATTACKS: dict[str, Callable[[str], str]] = {"verbosity": verbosity_attack, "confidence": confidence_attack}


@dataclass(frozen=True)
class AttackPrompt:
    prompt: str
    target: int  #: attacked identity (0/1)
    favored: str  #: outcome favouring the attacked candidate


def attack_prompt(
    question: str,
    candidates: Sequence[str],
    target: int,
    attack: str | Callable[[str], str],
    **kw,
) -> AttackPrompt:
    """Blind prompt with one candidate transformed by an attack; compare against the un-attacked Blind run [P B2.9]."""
    fn = ATTACKS[attack] if isinstance(attack, str) else attack
    c = list(candidates)
    c[target] = fn(c[target])
    return AttackPrompt(blind_prompt(question, c, **kw), target, ONE_FIRST if target == 0 else TWO_FIRST)


# ----------------------------------------------------------------------------------------------
# Outcome anchoring [P B2.1–B2.5]
# ----------------------------------------------------------------------------------------------


def outcome_distribution(verdicts) -> np.ndarray:
    """P(o) over (Tie, [1,2], [2,1]) from a verdict list, or from a count triple in that order."""
    v = list(verdicts)
    if len(v) == 3 and all(isinstance(x, (int, float, np.integer, np.floating)) for x in v):
        c = np.asarray(v, dtype=float)
    else:
        norm = [normalize_verdict(x) for x in v]
        c = np.array([norm.count(o) for o in OUTCOMES], dtype=float)
    if c.sum() <= 0:
        raise SiftError("outcome_distribution: no verdicts")
    return c / c.sum()


def equality_detection_rate(verdicts) -> float:
    """EDR = P(Tie) [P B2.1]."""
    return float(outcome_distribution(verdicts)[0])


def neutrality_deviation(verdicts) -> float:
    """ND = |P([1,2]) − P([2,1])| with ties in the denominator [P B2.2; formula verified on Gemma-PBP]."""
    p = outcome_distribution(verdicts)
    return float(abs(p[1] - p[2]))


@dataclass(frozen=True)
class OutcomeShift:
    """Tie-aware decomposition of the probe-vs-Blind outcome movement [P V-I]."""

    lds: float  #: max(0, Δ(f))  label-directed shift
    ts: float  #: max(0, Δ(Tie))  tie shift (not anchoring)
    ols: float  #: max(0, Δ(ō))  opposite-label shift
    tv: float  #: ½‖Δ‖₁ = LDS + TS + OLS
    lao: float  #: LDS / (LDS + TS + OLS); ``zero_division`` when TV = 0
    low_tv: bool  #: TV < ``min_tv``: LAO unstable [R]
    favored: str


def outcome_shift(
    blind,
    probe,
    favored: str,
    *,
    zero_division: float = float("nan"),
    min_tv: float = 0.02,
) -> OutcomeShift:
    """LDS, TS, OLS, TV and LAO of a probe against the same protocol's Blind run (marginal aggregation) [P].

    ``blind``/``probe`` are verdict lists or (Tie, [1,2], [2,1]) count triples; ``favored`` is f.
    """
    pb, pp = outcome_distribution(blind), outcome_distribution(probe)
    d = pp - pb
    f = normalize_verdict(favored)
    if f == TIE:
        raise SiftError("the favoured outcome must be [1,2] or [2,1]")
    fi = OUTCOMES.index(f)
    oi = 3 - fi  # the other non-tie index (1 ↔ 2)
    lds, ts, ols = max(0.0, d[fi]), max(0.0, d[0]), max(0.0, d[oi])
    tv = lds + ts + ols
    lao = lds / tv if tv > 0 else float(zero_division)
    return OutcomeShift(float(lds), float(ts), float(ols), float(tv), float(lao), bool(tv < min_tv), f)


def transition_matrix(blind_verdicts: Sequence[str], probe_verdicts: Sequence[str]) -> np.ndarray:
    """Paired 3×3 counts T[o_B, o_p] over (Tie, [1,2], [2,1]) [R diagnostic]."""
    if len(blind_verdicts) != len(probe_verdicts):
        raise SiftError("transition_matrix: verdict lists differ in length")
    t = np.zeros((3, 3), dtype=int)
    for b, p in zip(blind_verdicts, probe_verdicts):
        t[OUTCOMES.index(normalize_verdict(b)), OUTCOMES.index(normalize_verdict(p))] += 1
    return t


def outcome_shift_ci(
    blind_verdicts: Sequence[str],
    probe_verdicts: Sequence[str],
    favored: str,
    *,
    statistic: str = "lds",
    n_resamples: int = 1000,
    seed: int = 0,
) -> BootstrapCI:
    """Paired item bootstrap (items resampled jointly across conditions) for LDS/TS/OLS/TV/LAO [R extension]."""
    b = [normalize_verdict(x) for x in blind_verdicts]
    p = [normalize_verdict(x) for x in probe_verdicts]

    def stat(idx: np.ndarray) -> float:
        bb, pp = [b[i] for i in idx], [p[i] for i in idx]
        return getattr(outcome_shift(bb, pp, favored), statistic)

    return bootstrap_ci(stat, len(b), n_resamples=n_resamples, seed=seed)


@dataclass(frozen=True)
class RevisionSusceptibility:
    """RS after Reveal [R definition; numbers reported by the third-party audit]."""

    rs: float  #: share of items whose after-reveal verdict differs from the flip-stage verdict
    rs_directional: float  #: share revised *to* the truth-favoured outcome (nan if not given)
    n: int
    ci: tuple[float, float]  #: Wilson 95% CI on RS [R]


def revision_susceptibility(
    flip_stage: Sequence[str], after_reveal: Sequence[str], truth_favored: str | None = None
) -> RevisionSusceptibility:
    """RS = (1/N) Σ 1[r_after ≠ r_flip] within the same conversation."""
    if len(flip_stage) != len(after_reveal) or not flip_stage:
        raise SiftError("revision_susceptibility: need equal-length, non-empty verdict lists")
    a = [normalize_verdict(x) for x in flip_stage]
    b = [normalize_verdict(x) for x in after_reveal]
    changed = [x != y for x, y in zip(a, b)]
    n = len(a)
    if truth_favored is None:
        rd = float("nan")
    else:
        t = normalize_verdict(truth_favored)
        rd = float(np.mean([c and y == t for c, y in zip(changed, b)]))
    return RevisionSusceptibility(float(np.mean(changed)), rd, n, wilson_interval(sum(changed), n))


def same_decision_mask(blind_verdicts: Sequence[str], probe_verdicts: Sequence[str]) -> np.ndarray:
    """C_same = {d : r_d^(p) = r_d^(B)} [P B2.5]."""
    if len(blind_verdicts) != len(probe_verdicts):
        raise SiftError("same_decision_mask: verdict lists differ in length")
    return np.array([normalize_verdict(b) == normalize_verdict(p) for b, p in zip(blind_verdicts, probe_verdicts)])


# ----------------------------------------------------------------------------------------------
# Rationale anchoring [P B2.6–B2.8; scorers R]
# ----------------------------------------------------------------------------------------------


def _words(s: str) -> list[str]:
    return re.findall(r"\w+", s.lower())


def rouge_l_f1(a: str, b: str) -> float:
    """ROUGE-L F1 on lower-cased word tokens (LCS); 1.0 for two empty strings."""
    x, y = _words(a), _words(b)
    if not x and not y:
        return 1.0
    if not x or not y:
        return 0.0
    prev = [0] * (len(y) + 1)
    for xi in x:
        cur = [0]
        for j, yj in enumerate(y):
            cur.append(prev[j] + 1 if xi == yj else max(prev[j + 1], cur[j]))
        prev = cur
    lcs = prev[-1]
    if lcs == 0:
        return 0.0
    p, r = lcs / len(x), lcs / len(y)
    return 2 * p * r / (p + r)


def rouge_l_distance(a: str, b: str) -> float:
    """1 − ROUGE-L F1 (the spec's secondary drift scorer)."""
    return 1.0 - rouge_l_f1(a, b)


@dataclass(frozen=True)
class ExplanationDrift:
    """Δe | Same: mean explanation distance over same-decision items [P B2.6]."""

    value: float  #: NaN when C_same is empty
    n_same: int
    scorer: str


def explanation_drift(
    blind_verdicts: Sequence[str],
    probe_verdicts: Sequence[str],
    blind_explanations: Sequence[str],
    probe_explanations: Sequence[str],
    *,
    distance: Callable[[str, str], float] = rouge_l_distance,
    scorer: str | None = None,
) -> ExplanationDrift:
    """Δe|Same = (1/|C_same|) Σ_{d∈C_same} dist(e_d^(p), e_d^(B)), dist ∈ [0, 1].

    The paper never names the distance; pass a sentence-embedding ``1 − cos`` as ``distance`` for the
    primary scorer [R]. Items whose verdict changed are excluded.
    """
    same = same_decision_mask(blind_verdicts, probe_verdicts)
    if len(blind_explanations) != same.size or len(probe_explanations) != same.size:
        raise SiftError("explanation_drift: explanation lists must match the verdict lists")
    ds = [distance(probe_explanations[i], blind_explanations[i]) for i in np.flatnonzero(same)]
    name = scorer or getattr(distance, "__name__", "custom")
    return ExplanationDrift(float(np.mean(ds)) if ds else float("nan"), int(same.sum()), name)


#: Provenance lexicon [R]: label string → surface terms that invoke it.
PROVENANCE_TERMS: dict[str, tuple[str, ...]] = {
    "LLM": ("llm", "ai-generated", "ai generated", "machine-generated", "language model", "generated by ai"),
    "TradML": ("tradml", "traditional", "extractive"),
}
_POSITIVE = ("better", "best", "stronger", "superior", "preferred", "prefer", "clearer", "more fluent",
             "fluently", "more accurate", "more complete", "reads well", "excellent", "higher quality",
             "more coherent", "more polished")
_NEGATIVE = ("worse", "worst", "weaker", "inferior", "lacks", "poorer", "awkward", "less fluent",
             "less accurate", "less coherent", "lower quality", "choppy", "disjointed")
#: Attack cue lexicons [R; the paper's are unspecified].
CUE_LEXICONS: dict[str, tuple[str, ...]] = {
    "verbosity": ("detail", "detailed", "comprehensive", "comprehensively", "thorough", "thoroughly", "elaborate"),
    "confidence": ("precise", "clear", "clearly", "authoritative", "confident", "confidently", "decisive", "assertive"),
}


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?;])\s+", text.strip()) if s]


def _has(s: str, terms: Sequence[str]) -> bool:
    return any(re.search(r"(?<!\w)" + re.escape(t.lower()) + r"(?!\w)", s) for t in terms)


def _referenced(s: str, candidate_name: str, display_order: Sequence[int]) -> list[int]:
    """Identities referenced as '<Candidate> N' / 'first'/'second', in order of mention."""
    pat = rf"\b{re.escape(candidate_name.lower())}\s*([12])\b|\b(first|second)\b"
    out = []
    for m in re.finditer(pat, s):
        slot = int(m.group(1)) - 1 if m.group(1) else (0 if m.group(2) == "first" else 1)
        ident = display_order[slot]
        if ident not in out:
            out.append(ident)
    return out


def _polarity(s: str) -> int:
    return int(_has(s, _POSITIVE)) - int(_has(s, _NEGATIVE))


def label_alignment(
    explanation: str,
    favored: str,
    labels: Sequence[str | None],
    *,
    provenance_terms: dict[str, tuple[str, ...]] | None = None,
    candidate_name: str = "Summary",
    display_order: Sequence[int] = (0, 1),
    sentence_share: bool = False,
) -> float:
    """a(e, f) [P 'label-conforming rhetoric'; lexicon scorer R].

    1 if a sentence invokes a cue (a displayed label/badge or its provenance terms) *and* praises the
    cue-favoured candidate or disparages the other one. The candidate is the one referenced as
    '<Candidate> N' (first mention), else the one whose label the cue term denotes.
    ``sentence_share=True`` returns the share of sentences instead of the item-level binary.
    """
    terms = dict(PROVENANCE_TERMS if provenance_terms is None else provenance_terms)
    fav_ident = 0 if normalize_verdict(favored) == ONE_FIRST else 1
    term_owner: list[tuple[tuple[str, ...], int]] = []
    for ident, lab in enumerate(labels):
        if lab is None:
            continue
        term_owner.append(((lab.lower(),) + tuple(terms.get(lab, ())), ident))
    sents = _sentences(explanation.lower())
    hits = []
    for s in sents:
        owners = [ident for ts, ident in term_owner if _has(s, ts)]
        if not owners:
            hits.append(False)
            continue
        refs = _referenced(s, candidate_name, display_order)
        target = refs[0] if refs else owners[0]
        pol = _polarity(s)
        hits.append((target == fav_ident and pol > 0) or (target != fav_ident and pol < 0))
    if sentence_share:
        return float(np.mean(hits)) if hits else 0.0
    return float(any(hits))


@dataclass(frozen=True)
class RateOnSame:
    """A rate over the same-decision set with its Wilson CI."""

    value: float
    n_same: int
    ci: tuple[float, float]


def label_aligned_rationale(
    blind_verdicts: Sequence[str],
    probe_verdicts: Sequence[str],
    probe_explanations: Sequence[str],
    favored: Sequence[str] | str,
    labels: Sequence[Sequence[str | None]] | Sequence[str | None],
    *,
    scorer: Callable[..., float] = label_alignment,
    display_orders: Sequence[Sequence[int]] | None = None,
) -> RateOnSame:
    """LAI_text | Same = (1/|C_same|) Σ_{d∈C_same} a(e_d^(p), f_d) [P B2.7]."""
    same = same_decision_mask(blind_verdicts, probe_verdicts)
    n = same.size
    fav = [favored] * n if isinstance(favored, str) else list(favored)
    labs = [labels] * n if labels and (labels[0] is None or isinstance(labels[0], str)) else list(labels)
    orders = [(0, 1)] * n if display_orders is None else list(display_orders)
    vals = [scorer(probe_explanations[i], fav[i], labs[i], display_order=orders[i]) for i in np.flatnonzero(same)]
    k = int(same.sum())
    return RateOnSame(float(np.mean(vals)) if vals else float("nan"), k, wilson_interval(int(round(sum(vals))), k))


def cue_alignment(
    explanation: str,
    target: int,
    attack: str,
    *,
    candidate_name: str = "Summary",
    display_order: Sequence[int] = (0, 1),
) -> int:
    """1 if the explanation praises the attacked candidate with the attack's cue lexicon [P B2.8; lexicon R]."""
    lex = CUE_LEXICONS[attack]
    for s in _sentences(explanation.lower()):
        if not _has(s, lex) or _has(s, _NEGATIVE):
            continue
        refs = _referenced(s, candidate_name, display_order)
        if refs and refs[0] == target:
            return 1
    return 0


def cue_align_rate(explanations: Sequence[str], targets: Sequence[int], attack: str, **kw) -> float:
    """Cue-align % over all attacked items (a fraction in [0, 1])."""
    if len(explanations) != len(targets) or not explanations:
        raise SiftError("cue_align_rate: need equal-length, non-empty inputs")
    return float(np.mean([cue_alignment(e, t, attack, **kw) for e, t in zip(explanations, targets)]))


def simulate_cued_judge(
    blind_distribution: Sequence[float],
    favored: str,
    beta: float,
    gamma: float,
    n: int,
    seed: int = 0,
) -> tuple[list[str], list[str]]:
    """Synthetic judge [R B5.7]: Blind verdicts ~ P_B; under the cue switch to f w.p. β, to ō w.p. γ, else keep."""
    rng = np.random.default_rng(seed)
    pb = np.asarray(blind_distribution, float)
    b = rng.choice(3, size=n, p=pb / pb.sum())
    u = rng.random(n)
    fi = OUTCOMES.index(normalize_verdict(favored))
    p = np.where(u < beta, fi, np.where(u < beta + gamma, 3 - fi, b))
    return [OUTCOMES[i] for i in b], [OUTCOMES[i] for i in p]

