"""The companion papers' metrics run on the embedded organism (traces of a corpus built by ``sift-corpus``).

* :func:`run_ice` — ICE (paper 000) with token attributions (attention, gradient × input, a random control)
  under deletion and retrieval infill, and the step-level variant on CoT steps (Step-Delete / Step-Retain,
  Nec / Suf / SRC).
* :func:`run_edct` — EDCT (paper 004) applied to the CoT: the explanation's cited intermediate results are
  edited one after another (a cumulative chain), each edit is verified, the organism re-decodes the rest of
  its CoT and its answer, and a rule judge scores answer- and explanation-side consistency (binary and graded).
* :func:`run_system1` — the System-1 audit (paper 003) of the organism's answer distributions over its value
  space: calibration, the 1 − H(p)/ln K confidence, flip rates across preserving views, and guard metrics.

The score everywhere is the organism's answer distribution: a restricted softmax over the domain's answer
space at the position after ``answer :``, teacher-forced on the trace's exact token ids (never re-tokenised).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from sift.companion.edct import DEFAULT_EDCT, EDCTSettings
from sift.corpus.axes import generated_axes
from sift.corpus.store import iter_jsonl
from sift.corpus.verify import cot_ids_of
from sift.errors import SiftError
from sift.lm.latent import TraceLatent

REQUIRED_FIELDS = ("trace_id", "base_item", "domain", "family", "condition", "prompt_ids", "generated_ids",
                   "cot_span", "answer")
HEADER_WORDS = {"terse", "verbose", "explain"}


# ----------------------------------------------------------------------------------------------
# Traces
# ----------------------------------------------------------------------------------------------


_READ_CACHE: dict[tuple[str, float, int], list[dict]] = {}


def _read_traces(path: Path) -> list[dict]:
    """Parse and validate ``traces.jsonl`` once per (path, mtime, size)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime, st.st_size)
    if key in _READ_CACHE:
        return _READ_CACHE[key]
    out: list[dict] = []
    for ln, r in iter_jsonl(path):
        miss = [f for f in REQUIRED_FIELDS if f not in r]
        if miss:
            raise SiftError(f"{path}:{ln}: missing field(s) {miss}")
        if not (isinstance(r["cot_span"], list) and len(r["cot_span"]) == 2):
            raise SiftError(f"{path}:{ln}: field 'cot_span' must be [start, end], got {r['cot_span']!r}")
        out.append(r)
    _READ_CACHE.clear()
    _READ_CACHE[key] = out
    return out


def load_traces(corpus_dir: str | Path, *, families: Sequence[str] | None = None,
                conditions: Sequence[str] | None = None, n: int | None = None, seed: int = 0,
                require_phi: bool = True, n_items: int | None = None) -> list[dict]:
    """Traces of ``corpus_dir/traces.jsonl`` filtered by family / condition, with a parsable answer and
    (``require_phi``) a verified φ*. ``n_items`` keeps every trace of a deterministic subsample of base items
    (so views of one item stay together); ``n`` then keeps a deterministic subsample of traces balanced over φ*
    (as far as the classes allow). A malformed line raises a SiftError naming the file, line and field."""
    path = Path(corpus_dir) / "traces.jsonl"
    if not path.exists():
        raise SiftError(f"{path}: no such file (build a corpus with sift-corpus, or set companion.data.corpus_dir)")
    out = [r for r in _read_traces(path)
           if (families is None or r["family"] in families) and (conditions is None or r["condition"] in conditions)
           and r["answer"] is not None and not (require_phi and r.get("phi") is None)]
    if not out:
        raise SiftError(f"{path}: no trace matches families={families} conditions={conditions}")
    if n_items is not None:
        items = sorted({r["base_item"] for r in out},
                       key=lambda b: hashlib.sha256(f"{seed}:{b}".encode()).hexdigest())[:n_items]
        keep = set(items)
        out = [r for r in out if r["base_item"] in keep]
    return balanced_subsample(out, n, seed)


def balanced_subsample(traces: list[dict], n: int | None, seed: int = 0) -> list[dict]:
    """A deterministic subsample of ``n`` traces balanced over φ* as far as the classes allow (all if fewer)."""
    if n is None or len(traces) <= n:
        return traces
    key = lambda r: hashlib.sha256(f"{seed}:{r['trace_id']}".encode()).hexdigest()  # noqa: E731
    by_phi: dict[Any, list[dict]] = {}
    for r in sorted(traces, key=key):
        by_phi.setdefault(r.get("phi"), []).append(r)
    groups = sorted(by_phi.values(), key=len)
    picked: list[dict] = []
    for i, g in enumerate(groups):  # smaller classes first; each takes its fair share of what is left
        share = (n - len(picked)) // (len(groups) - i)
        picked += g[:share]
    return sorted(picked, key=lambda r: r["trace_id"])


def item_of(trace: dict):
    """The base item a trace was generated from (items are pure functions of domain, seed and index)."""
    from sift.organism.domains import make_item

    try:
        _, seed, idx = trace["base_item"].rsplit("-", 2)
        return make_item(trace["domain"], int(seed), int(idx))
    except (ValueError, SiftError) as e:
        raise SiftError(f"trace {trace['trace_id']}: cannot rebuild base item {trace['base_item']!r} ({e})") from None


# ----------------------------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------------------------


class OrganismScorer:
    """Last-position logits of an organism for many id sequences (batched, left-padded, memoised)."""

    def __init__(self, source, batch_size: int = 256):
        self.src = source
        self.batch_size = batch_size
        self.cache: dict[tuple, np.ndarray] = {}
        self.n_forward = 0

    def _run(self, seqs: list[tuple]) -> None:
        """Score keys ``(ids, latent)``: latent = (value, first CoT position, mechanism kind) replayed (organism v3)
        or None."""
        import torch

        from sift.lm.generation import left_padded
        from sift.organism.latent import injected, latent_kind

        model, pad = self.src.model, self.src.tokenizer.pad_token_id
        n_pos = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", 10**9)
        model.eval()
        todo = sorted({s for s in seqs if s not in self.cache}, key=lambda s: len(s[0]))
        with torch.no_grad():
            for st in range(0, len(todo), self.batch_size):
                chunk = todo[st:st + self.batch_size]
                width = max(len(c[0]) for c in chunk)
                if width > n_pos:
                    raise SiftError(f"sequence of {width} tokens exceeds the organism's {n_pos} positions")
                ids, mask, pos = left_padded([c[0] for c in chunk], pad)
                lat = [c[1] for c in chunk]
                vals = None if any(x is None for x in lat) else [x[0] for x in lat]
                starts = None if vals is None else [min(x[1], len(c[0])) for x, c in zip(lat, chunk)]
                with injected(model, vals, starts, kind=latent_kind(lat)):
                    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1].double().numpy()
                self.n_forward += len(chunk)
                for p, row in zip(chunk, logits):
                    self.cache[p] = row

    def probs(self, seqs: Sequence[Sequence[int]], space_ids: Sequence[int],
              latent: TraceLatent | Sequence[TraceLatent | None] | None = None) -> np.ndarray:
        """(n, K) softmax over ``space_ids`` at the last position of each sequence. ``latent``: the trace's
        mechanism latent (value, first CoT position, kind), one for all sequences or one per sequence (organism v3;
        sequences derived from one trace replay its latent)."""
        per = list(latent) if isinstance(latent, list) else [latent] * len(seqs)
        keys = [(tuple(int(i) for i in s), lat) for s, lat in zip(seqs, per)]
        self._run(keys)
        z = np.array([self.cache[k][list(space_ids)] for k in keys])
        z = z - z.max(1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(1, keepdims=True)


@dataclass
class Prepared:
    """One trace laid out for intervention: ids = prompt + CoT + ``answer :``."""

    trace: dict
    ids: list[int]
    n_prompt: int
    n_cot: int
    space: tuple[str, ...]
    space_ids: list[int]
    full_probs: np.ndarray
    pred: int
    cot_words: list[str]
    steps: list[tuple[int, int]] = field(default_factory=list)  #: CoT step spans (word positions, ';' included)
    #: the candidates in a view-independent form (real LMs: an option's text, since reordered options are
    #: relabelled); None: ``space`` itself
    canon: tuple[str, ...] | None = None

    def key(self, i: int) -> str:
        """Candidate ``i`` as views of one item can compare it."""
        return (self.canon or self.space)[i]

    @property
    def phi(self):
        return self.trace.get("phi")

    @property
    def latent(self) -> TraceLatent | None:
        """The trace's mechanism latent (value, first CoT position, kind), replayed by every re-score (organism v3)."""
        from sift.organism.latent import trace_latent

        return trace_latent(self.trace)


class TraceLayout(Protocol):
    """What the companion reads of a source to lay a trace out (prompt + CoT + the forced answer start): the
    organism (:class:`OrganismLayout`) and a real LM (:class:`sift.companion.lm_traces.LMLayout`)."""

    def read(self, cot_ids: list[int]) -> Any:
        """The source's reading of CoT ids (words, or text)."""
        ...

    def answer_prefix(self, cot: Any) -> list[int]:
        ...

    def steps(self, cot_ids: list[int], cot: Any) -> tuple[list[str], list[tuple[int, int]]]:
        """(the CoT's units as :attr:`Prepared.cot_words` holds them, the token spans of its steps)."""
        ...

    def spaces(self, traces: Sequence[dict]) -> list[tuple[tuple[str, ...], list, tuple[str, ...] | None]]:
        """Per trace: its candidate answers, their ids and their view-independent form (None: the answers)."""
        ...


class OrganismLayout:
    """The organism's :class:`TraceLayout`: a CoT is its words, a step ends at ``;``, the candidates are the
    domain's answer space, the answer is forced by ``answer :``."""

    def __init__(self, src):
        self.src = src

    def read(self, cot_ids: list[int]) -> list[str]:
        return self.src.words(cot_ids)

    def answer_prefix(self, cot: list[str]) -> list[int]:
        return self.src.ids(["answer", ":"])

    def steps(self, cot_ids: list[int], cot: list[str]) -> tuple[list[str], list[tuple[int, int]]]:
        ends = [i for i, w in enumerate(cot) if w == ";"]
        starts = [0] + [e + 1 for e in ends[:-1]]
        return cot, [(a, b + 1) for a, b in zip(starts, ends)]

    def spaces(self, traces: Sequence[dict]) -> list[tuple[tuple[str, ...], list, None]]:
        from sift.organism.domains import answer_space

        return [(sp, self.src.ids(list(sp)), None) for sp in (answer_space(r["domain"]) for r in traces)]


def prepare(layout: TraceLayout, scorer, traces: Sequence[dict]) -> list[Prepared]:
    """Token layout, answer space and the full-input answer distribution of each trace (one batched pass per
    answer space), for any source's :class:`TraceLayout`."""
    out = []
    for r, (space, space_ids, canon) in zip(traces, layout.spaces(traces)):
        cot_ids = cot_ids_of(r)
        cot = layout.read(cot_ids)
        units, steps = layout.steps(cot_ids, cot)
        out.append(Prepared(r, list(r["prompt_ids"]) + cot_ids + layout.answer_prefix(cot), len(r["prompt_ids"]),
                            len(cot_ids), space, space_ids, np.zeros(0), -1, units, steps, canon))
    return score_full_inputs(scorer, out)


def score_full_inputs(scorer, prepared: list[Prepared]) -> list[Prepared]:
    """Fill each record's full-input answer distribution and prediction: one batched pass per answer space.
    Each trace's mechanism latent goes with it (organism v3; a real LM's scorer has none to replay)."""
    groups: dict[tuple, list[Prepared]] = {}
    for p in prepared:
        groups.setdefault(tuple(tuple(i) if isinstance(i, (list, tuple)) else i for i in p.space_ids), []).append(p)
    for ps in groups.values():
        pr = scorer.probs([p.ids for p in ps], ps[0].space_ids, [p.latent for p in ps])
        for p, row in zip(ps, pr):
            p.full_probs = row
            p.pred = int(row.argmax())
    return prepared


def content_mask(p: Prepared, src, span: str = "both") -> np.ndarray:
    """Positions ICE may select and intervene on [R: content-span mode]: the question and cue words of the
    prompt (not BOS, the budget/explain header or ``reason :``) and/or the CoT; ``answer :`` is template."""
    n = len(p.ids)
    m = np.zeros(n, bool)
    if span in ("prompt", "both"):
        words = src.words(p.ids[1:p.n_prompt])
        for i, w in enumerate(words, start=1):
            if i < p.n_prompt - 2 and not (w in HEADER_WORDS and all(x in HEADER_WORDS for x in words[:i])):
                m[i] = True
    if span in ("cot", "both"):
        m[p.n_prompt:p.n_prompt + p.n_cot] = True
    if span not in ("prompt", "cot", "both"):
        raise SiftError(f"companion.ice.span must be 'prompt', 'cot' or 'both', got {span!r}")
    return m


# ----------------------------------------------------------------------------------------------
# ICE
# ----------------------------------------------------------------------------------------------


def _attention(src, p: Prepared, rng: np.random.Generator) -> np.ndarray:
    from sift.companion.ice import attention_attribution

    return attention_attribution(src.model, p.ids)


def _gradient(kind: str) -> Callable[[Any, Prepared, np.random.Generator], np.ndarray]:
    def explain(src, p: Prepared, rng: np.random.Generator) -> np.ndarray:
        from sift.companion.ice import gradient_attribution

        target = p.space_ids[p.pred]  # a real LM's candidate is several tokens: its first one
        return gradient_attribution(src.model, p.ids, target[0] if isinstance(target, tuple) else target, kind)

    return explain


#: ICE explainers: name → ``explain(src, prepared, rng)``, token scores for ``prepared.ids`` (run with the
#: trace's latent injected). 'attention': last position, mean over layers and heads; the gradient ones on the
#: logit of the predicted answer token; 'random': a control explainer. A new explainer adds one entry.
EXPLAINERS: dict[str, Callable[[Any, Prepared, np.random.Generator], np.ndarray]] = {
    "attention": _attention,
    **{k: _gradient(k) for k in ("grad_x_input", "grad_x_input_norm", "grad_norm")},
    "random": lambda src, p, rng: rng.random(len(p.ids)),
}

#: ICE operators: name → ``make(pool, seed)``, the intervention that keeps a token set (the pool: the
#: retrieval infill's filler tokens; the seed: its draws, one per (trace, explainer)). A new one adds an entry.
OPERATORS: dict[str, Callable[[list[int], int], Any]] = {
    "deletion": lambda pool, seed: _ice().delete,
    "retrieval": lambda pool, seed: _ice().RetrievalInfill(pool, seed=seed),
}


def _ice():
    from sift.companion import ice

    return ice


def token_attribution(src, p: Prepared, explainer: str, rng: np.random.Generator) -> np.ndarray:
    """Token scores for ``p.ids`` from the :data:`EXPLAINERS` entry ``explainer``, with the trace's latent."""
    from sift.organism.latent import injected, latent_kind

    if explainer not in EXPLAINERS:
        raise SiftError(f"companion.ice.explainers: unknown explainer {explainer!r} ({', '.join(EXPLAINERS)})")
    lat = p.latent
    with injected(src.model, None if lat is None else [lat.value], None if lat is None else [lat.start],
                  kind=latent_kind([lat])):
        return EXPLAINERS[explainer](src, p, rng)


@dataclass(frozen=True)
class ICESettings:
    """What one ICE audit runs (the ``companion.ice`` node, :meth:`from_config`): explainers × operators, the
    rationale share ``k``, ``n_null`` random equal-size sets, the units ICE may select (``span``: prompt, cot or
    both), whether answer values stay out of the retrieval pool, the win-rate CI (``n_resamples``, ``alpha``),
    the seed, and the step-level variant (``step_level``, ``step_n_null`` sets)."""

    explainers: tuple[str, ...]
    operators: tuple[str, ...]
    k: float = 0.2
    n_null: int = 50
    span: str = "both"
    blacklist_values: bool = True
    n_resamples: int = 200
    alpha: float = 0.10
    seed: int = 0
    step_level: bool = True
    step_n_null: int = 50

    def __post_init__(self) -> None:
        object.__setattr__(self, "explainers", tuple(str(e) for e in self.explainers))
        object.__setattr__(self, "operators", tuple(str(o) for o in self.operators))
        for kind, names, known in (("operator", self.operators, OPERATORS), ("explainer", self.explainers, EXPLAINERS)):
            for n in names:
                if n not in known:
                    raise SiftError(f"companion.ice.{kind}s: unknown {kind} {n!r} ({', '.join(known)})")

    @classmethod
    def from_config(cls, node: Any, seed: int) -> ICESettings:
        """From a ``companion.ice`` node (its ``resamples`` is ``n_resamples``) and the companion's seed."""
        return cls(explainers=tuple(node.explainers), operators=tuple(node.operators), k=float(node.k),
                   n_null=int(node.n_null), span=str(node.span), blacklist_values=bool(node.blacklist_values),
                   n_resamples=int(node.resamples), alpha=float(node.alpha), seed=int(seed),
                   step_level=bool(node.step_level))


def run_ice(src, scorer: OrganismScorer, prepared: Sequence[Prepared], settings: ICESettings, *,
            progress: bool = True, masks: Sequence[np.ndarray] | None = None,
            value_ids: set[int] | None = None) -> dict:
    """Token-level ICE per (explainer, operator) and the step-level variant; summaries overall and by φ*.
    ``masks`` (the positions each trace's ICE may select) and ``value_ids`` (answer tokens kept out of the
    retrieval pool) default to the organism's; a real-LM corpus passes those of :mod:`sift.companion.lm_traces`."""
    from tqdm.auto import tqdm

    from sift.companion import ice
    from sift.organism.domains import DOMAINS, answer_space

    st = settings
    explainers, operators, k, seed = st.explainers, st.operators, st.k, st.seed

    special = {src.tokenizer.bos_token_id, src.tokenizer.pad_token_id, src.tokenizer.eos_token_id}
    banned = set(special)
    if st.blacklist_values:  # ICE blacklists label words from the filler pool; our labels are the answer values
        banned |= set(src.ids(sorted({v for d in DOMAINS for v in answer_space(d)}))) if value_ids is None \
            else set(value_ids)
    masks = [content_mask(p, src, st.span) for p in prepared] if masks is None else list(masks)
    corpus = {}
    for p, m in zip(prepared, masks):
        corpus.setdefault(p.trace["base_item"], []).extend(int(t) for t, v in zip(p.ids, m) if v)
    rows: dict[tuple[str, str], list] = {(e, o): [] for e in explainers for o in operators}
    step_rows: dict[str, list] = {e: [] for e in explainers}
    necsuf: list = []
    rng_attr = np.random.default_rng(seed)
    for n_ex, (p, valid) in enumerate(tqdm(list(zip(prepared, masks)), desc="ICE", disable=not progress)):
        units = list(p.ids)
        pos = np.flatnonzero(valid)
        if pos.size <= ice.rationale_size(pos.size, k):  # ice_example's skip, checked before the attributions
            continue                                     # draw from rng_attr
        pool = ice.build_retrieval_pool(corpus, p.trace["base_item"], blacklist=banned)

        def score(seqs, p=p) -> np.ndarray:  # deletions may shift the CoT start
            return scorer.probs(seqs, p.space_ids, p.latent)[:, p.pred]

        attrs = {e: token_attribution(src, p, e, rng_attr) for e in explainers}
        for e in explainers:
            # retrieval is seeded per (example, explainer): the rationale gets one draw, each null set a fresh one
            op_seed = int.from_bytes(hashlib.sha256(f"{seed}:{n_ex}:{e}".encode()).digest()[:4], "little")
            ops = {o: OPERATORS[o](pool, op_seed) for o in operators}
            res = ice.ice_example(units, attrs[e], score, ops, k=k, n_null=st.n_null, seed=[seed, n_ex],
                                  valid_mask=valid)
            for o in operators:
                rows[(e, o)].append((p.phi, p.trace["base_item"], res[o]))
        if not st.step_level or len(p.steps) < 2:
            continue
        prompt, ans = p.ids[:p.n_prompt], p.ids[p.n_prompt + p.n_cot:]
        cot = p.ids[p.n_prompt:p.n_prompt + p.n_cot]
        steps = [tuple(cot[a:b]) for a, b in p.steps]

        def seq(sub, prompt=prompt, ans=ans) -> list[int]:
            return prompt + [t for s in sub for t in s] + ans

        # warm the cache with every Delete / Retain of the subsets step ICE can draw (one batch)
        qs = ice.rationale_size(len(steps), k)
        from itertools import combinations
        subs = list(combinations(range(len(steps)), qs))
        warm = [seq(steps)] + [seq([s for i, s in enumerate(steps) if i not in c]) for c in subs] \
            + [seq([steps[i] for i in c]) for c in subs]
        scorer.probs(warm, p.space_ids, p.latent)

        def step_score(sub, seq=seq, p=p) -> float:
            return float(scorer.probs([seq(sub)], p.space_ids, p.latent)[0, p.pred])

        def step_answer(sub, seq=seq, p=p) -> int:
            return int(scorer.probs([seq(sub)], p.space_ids, p.latent)[0].argmax())

        for e in explainers:
            sa = ice.pool_step_scores(attrs[e][p.n_prompt:p.n_prompt + p.n_cot], p.steps, "sum")
            r = ice.step_ice(steps, sa, step_score, k=k, n_null=st.step_n_null, seed=seed + n_ex)
            if r is not None:
                step_rows[e].append((p.phi, r))
        ns = ice.step_necessity_sufficiency(steps, step_answer, reference_answer=p.pred, k=k, n_subsets=None)
        necsuf.append((p.phi, ns))
    return summarize_ice(rows, step_rows, necsuf, prepared, n_resamples=st.n_resamples, alpha=st.alpha, seed=seed,
                         config=dict(explainers=list(explainers), operators=list(operators), k=k, n_null=st.n_null,
                                     span=st.span, blacklist_values=st.blacklist_values, n_resamples=st.n_resamples,
                                     alpha=st.alpha, seed=seed,
                                     s_empty="template with empty content (deletion of every content unit)",
                                     comparison="raw retained score s(x_o^r) [R]; NSR reported for magnitude",
                                     step_n_null=st.step_n_null))


def _summary_dict(s) -> dict:
    return {"n": s.n_examples, "win_rate": s.win_rate.estimate, "ci_low": s.win_rate.low, "ci_high": s.win_rate.high,
            "midrank_win_rate": s.midrank_win_rate, "tie_rate": s.tie_rate, "mean_d_null": s.mean_d_null,
            "sig_rate_bh": s.sig_rate_bh, "sig_rate_raw": s.sig_rate_raw, "taxonomy": s.taxonomy,
            "anti_faithful": s.anti_faithfulness.anti_faithful,
            "tie_confounded": s.anti_faithfulness.tie_confounded}


def summarize_ice(rows, step_rows, necsuf, prepared, *, n_resamples: int, alpha: float, seed: int,
                  config: dict) -> dict:
    from sift.companion import ice

    token: dict[str, dict] = {}
    per_example: dict[str, list] = {}
    for (e, o), res in rows.items():
        key = f"{e}/{o}"
        valid = [(phi, item, r) for phi, item, r in res if r.stats.valid]
        if not valid:
            continue

        def summary(sel: list) -> dict:  # the WR CI resamples base items (a trace's views are not independent)
            return _summary_dict(ice.ice_summary([r for _, _, r in sel], n_resamples=n_resamples, seed=seed,
                                                 alpha=alpha, groups=[str(i) for _, i, _ in sel]))

        d = {"all": summary(valid)}
        for cls in (0, 1):
            sel = [x for x in valid if x[0] == cls]
            if sel:
                d[f"phi={cls}"] = summary(sel)
        nsr = [r.nsr for _, _, r in valid if r.nsr_defined]
        d["mean_nsr"] = float(np.mean(nsr)) if nsr else float("nan")
        d["nsr_defined_rate"] = float(np.mean([r.nsr_defined for _, _, r in valid]))
        token[key] = d
        per_example[key] = [r.stats.win_rate for _, _, r in valid]
    gaps = {}
    ops = config["operators"]
    if "deletion" in ops and "retrieval" in ops:
        for e in config["explainers"]:
            a, b = token.get(f"{e}/deletion"), token.get(f"{e}/retrieval")
            if a and b:
                g = ice.operator_gap(a["all"]["win_rate"], b["all"]["win_rate"])
                gaps[e] = {"gap_pp": 100 * g.gap, "crossing_55": g.crossing, "agree": g.agree,
                           "class_deletion": g.class_a, "class_retrieval": g.class_b}
    steps: dict[str, dict] = {}
    for e, lst in step_rows.items():
        if not lst:
            continue
        out = {}
        for name, sel in (("all", lst), ("phi=0", [x for x in lst if x[0] == 0]),
                          ("phi=1", [x for x in lst if x[0] == 1])):
            if not sel:
                continue
            nec = [r.necessity for _, r in sel if r.necessity.valid]
            suf = [r.sufficiency for _, r in sel if r.sufficiency.valid]
            out[name] = {"n": len(sel),
                         "nec_win_rate": float(np.mean([r.win_rate for r in nec])) if nec else float("nan"),
                         "nec_midrank": float(np.mean([r.midrank_win_rate for r in nec])) if nec else float("nan"),
                         "suf_win_rate": float(np.mean([r.win_rate for r in suf])) if suf else float("nan"),
                         "suf_midrank": float(np.mean([r.midrank_win_rate for r in suf])) if suf else float("nan"),
                         "tie_rate_nec": float(np.mean([r.tie_rate for r in nec])) if nec else float("nan")}
        steps[e] = out
    src_d = {}
    for name, sel in (("all", necsuf), ("phi=0", [x for x in necsuf if x[0] == 0]),
                      ("phi=1", [x for x in necsuf if x[0] == 1])):
        if sel:
            nec = float(np.mean([r.necessity for _, r in sel]))
            suf = float(np.mean([r.sufficiency for _, r in sel]))
            src_d[name] = {"n": len(sel), "necessity": nec, "sufficiency": suf, "src": nec * (1 - suf),
                           "taxonomy": ice.src_taxonomy(nec * (1 - suf))}
    return {"config": config, "token": token, "operator_gap": gaps, "step": steps, "step_src": src_d,
            "per_example_win_rates": per_example, "n_traces": len(prepared)}


# ----------------------------------------------------------------------------------------------
# EDCT on the CoT
# ----------------------------------------------------------------------------------------------


@dataclass
class ParsedStep:
    """A computing step ``lhs op rhs = result`` of a CoT (word positions of lhs and result)."""

    lhs: str
    op: str
    rhs: str
    result: str
    lhs_pos: int
    result_pos: int


def parse_steps(words: Sequence[str]) -> list[ParsedStep]:
    """Computing steps of an organism CoT (either lexicon; ``and``/``or`` are read back from ``xx``)."""
    from sift.organism.render import xx_word

    back = {xx_word(w): w for w in ("and", "or")}
    out = []
    for i, w in enumerate(words):
        if w == "=" and i >= 3 and i + 1 < len(words):
            op = back.get(words[i - 2], words[i - 2])
            out.append(ParsedStep(words[i - 3], op, words[i - 1], words[i + 1], i - 3, i + 1))
    return out


def reference_answer(domain: str, start: str, rest: Sequence[ParsedStep], options=()) -> str | None:
    """The answer the stated computation implies when the running value is ``start`` before ``rest``."""
    from sift.organism.domains import apply_op

    cur = start
    try:
        for s in rest:
            cur = apply_op("arithmetic" if domain == "choice" else domain, cur, s.op, s.rhs)
    except (ValueError, KeyError):
        return None
    if domain == "choice":
        lab = [lab for lab, v in options if v == cur]
        return lab[0] if lab else None
    return cur


@dataclass
class EDCTStepRecord:
    trace_id: str
    phi: Any
    chain_step: int
    step_index: int
    old: str
    new: str
    verified: bool
    change_in: float
    change_out: float
    necessary: bool
    ref_answer: str | None
    prev_answer: str
    new_answer: str | None
    pcs: int
    ncc: int
    graded: int


class _OrganismChains:
    """EDCT on the organism's CoT (:class:`sift.companion.edct.ChainSource`): a chain step edits the result of
    one of the last ``k`` computing steps, the organism re-decodes the rest of its CoT and its answer from the
    edited prefix (its latent replayed), and the rule judge scores the continuation."""

    def __init__(self, src, settings: EDCTSettings, max_new_tokens: int):
        self.src, self.settings, self.max_new_tokens = src, settings, max_new_tokens

    def propose(self, st: dict, step_no: int) -> tuple[tuple | None, EDCTStepRecord | None]:
        from sift.companion import edct
        from sift.organism.source import value_space

        if step_no >= len(st["targets"]):
            return None, None
        p = st["p"]
        steps = parse_steps(st["words"])
        j = st["targets"][step_no]
        if j >= len(steps):
            return None, None
        s = steps[j]
        space = value_space(s.result)
        if space is None:
            return None, None
        rest = steps[j + 1:]
        ref_prev = reference_answer(p.trace["domain"], s.result, rest, st["options"])
        salt = int(hashlib.sha256(f"{self.settings.seed}:{p.trace['trace_id']}:{step_no}".encode()).hexdigest(), 16)
        cands = [v for v in space if v != s.result]
        cands = cands[salt % len(cands):] + cands[:salt % len(cands)]
        # prefer values whose implied answer exists and differs from the current answer and the cue
        good = [v for v in cands if reference_answer(p.trace["domain"], v, rest, st["options"]) not in
                (None, st["answer"], st["cue"])]
        ok = [v for v in cands if reference_answer(p.trace["domain"], v, rest, st["options"]) is not None]
        new = (good or ok or [None])[0]
        prefix = st["words"][:s.result_pos + 1]
        if new is None:
            return None, None
        edited = prefix[:-1] + [new]
        a = len(" ".join(prefix[:-1])) + (1 if len(prefix) > 1 else 0)
        v = edct.verify_edit(" ".join(prefix), " ".join(edited), (a, a + len(prefix[-1])),
                             tau_in=self.settings.tau_in, tau_out=self.settings.tau_out)
        ref_new = reference_answer(p.trace["domain"], new, rest, st["options"])
        if not v.passed or ref_new is None:
            return None, EDCTStepRecord(p.trace["trace_id"], p.phi, step_no, j, s.result, new, False, v.change_in,
                                        v.change_out, False, ref_new, st["answer"], None, 0, 0, 1)
        return (step_no, j, s, new, edited, ref_prev, ref_new, v), None

    def requery(self, jobs: Sequence[tuple[dict, tuple]], step_no: int) -> list[list[int]]:
        lats = [st["p"].latent for st, _ in jobs]  # the trace's latent from its first CoT position on
        return self.src.generate([st["p"].ids[:st["p"].n_prompt] + self.src.ids(job[4]) for st, job in jobs],
                                 max_new_tokens=self.max_new_tokens,
                                 **({} if None in lats else {"latents": [x.value for x in lats],
                                                             "starts": [x.start for x in lats]}))

    def score(self, st: dict, job: tuple, g: list[int]) -> EDCTStepRecord:
        from sift.companion import edct
        from sift.organism.source import split_completion

        step_no, j, s, new, edited, ref_prev, ref_new, v = job
        p = st["p"]
        cot_cont, new_answer = split_completion(self.src.words(g))
        new_words = edited + cot_cont
        after = [x for x in parse_steps(new_words) if x.lhs_pos > s.result_pos]
        # NCC: the re-decoded explanation carries the edited value on: the next step starts from it and every
        # later step starts from the previous stated result (no step falls back on the replaced value)
        chain_ok = True
        run = new
        for x in after:
            if x.lhs != run:
                chain_ok = False
                break
            run = x.result
        still_old = any(x.lhs == s.result and s.result != new for x in after[:1])
        ncc = edct.concept_consistency(still_old or not chain_ok)
        necessary = ref_new != ref_prev
        changed = new_answer != st["answer"]
        pcs = edct.prediction_change_score(changed, necessary, new_answer == ref_new)
        cites_new = bool(after) and after[0].lhs == new
        graded = edct.graded_rubric(pcs, ncc, changed, cites_new or not after)
        st["judg"].append(edct.StepJudgement(pcs, ncc, graded))
        rec = EDCTStepRecord(p.trace["trace_id"], p.phi, step_no, j, s.result, new, True, v.change_in, v.change_out,
                             necessary, ref_new, st["answer"], new_answer, pcs, ncc, graded)
        st["words"], st["answer"] = new_words, new_answer if new_answer is not None else st["answer"]
        if new_answer is None:
            st["alive"] = False
        return rec


def run_edct(src, prepared: Sequence[Prepared], settings: EDCTSettings = DEFAULT_EDCT, *,
             progress: bool = True) -> dict:
    """EDCT on the CoT [spec B5 adaptation]: for each trace, the last ``k`` computing steps' results (the
    numbers the explanation cites as its support) are edited in chronological order, cumulatively. Each edit
    is verified (token-level: the cited value and nothing else changed; and the edited chain still has an
    implied answer in range), the organism re-decodes the rest of its CoT and its answer from the edited
    prefix, and a rule judge scores PCS (answer follows the edit where the edited value is necessary), NCC
    (the re-decoded explanation carries the edited value on, not the replaced one) and the graded rubric; the
    chains run on :func:`sift.companion.edct.run_chains`."""
    from sift.companion import edct

    k = settings.k
    max_new_tokens = 64 if settings.max_new_tokens is None else settings.max_new_tokens
    states = []
    for p in prepared:
        item = item_of(p.trace)
        steps = parse_steps(p.cot_words)
        if not steps:
            continue
        chosen = list(range(len(steps)))[-k:]
        states.append({"p": p, "options": item.options, "words": list(p.cot_words), "answer": p.trace["answer"],
                       "targets": chosen, "alive": True, "judg": [], "cue": (p.trace.get("cue") or {}).get("value")})
    records = edct.run_chains(_OrganismChains(src, settings, max_new_tokens), states, k,
                              desc="EDCT chain", progress=progress)
    samples: list[dict] = []
    for st in states:
        ccs, pcs, ncc, graded = edct.sample_scores(st["judg"], settings.graded_scheme)
        samples.append({"trace_id": st["p"].trace["trace_id"], "base_item": str(st["p"].trace["base_item"]),
                        "phi": st["p"].phi, "domain": st["p"].trace["domain"],
                        "k_prime": len(st["judg"]), "ccs": ccs, "pcs": pcs, "ncc": ncc, "graded": graded})
    return summarize_edct(samples, records, n_resamples=settings.n_resamples, seed=settings.seed,
                          config=dict(**settings.record(max_new_tokens),
                                      concepts="results of the last k computing steps, edited in chronological order",
                                      chain_failure="truncate the chain at the first failed verification [R]",
                                      judge="rule judge: PCS from the implied answer of the edited chain; "
                                            "NCC = the re-decoded steps carry the edited value on"))


def summarize_edct(samples: list[dict], records: list[EDCTStepRecord], *, n_resamples: int, seed: int,
                   config: dict) -> dict:
    from sift.companion._stats import bootstrap_mean_ci
    from sift.metrics import auroc

    ok = [s for s in samples if s["k_prime"] > 0]
    out: dict[str, Any] = {"config": config, "n_traces": len(samples), "n_scored": len(ok),
                           "n_edits": len(records),
                           "verified_rate": float(np.mean([r.verified for r in records])) if records else float("nan")}
    for name, sel in (("all", ok), ("phi=0", [s for s in ok if s["phi"] == 0]),
                      ("phi=1", [s for s in ok if s["phi"] == 1])):
        if not sel:
            continue
        units = [str(s.get("base_item", s["trace_id"])) for s in sel]  # the CIs resample base items
        ci = bootstrap_mean_ci([s["ccs"] for s in sel], n_resamples=n_resamples, seed=seed, groups=units)
        gci = bootstrap_mean_ci([s["graded"] for s in sel], n_resamples=n_resamples, seed=seed, groups=units)
        out[name] = {"n": len(sel), "ccs_binary": ci.estimate, "ccs_ci": [ci.low, ci.high],
                     "pcs": float(np.mean([s["pcs"] for s in sel])), "ncc": float(np.mean([s["ncc"] for s in sel])),
                     "ccs_graded": gci.estimate, "graded_ci": [gci.low, gci.high],
                     "mean_chain_length": float(np.mean([s["k_prime"] for s in sel]))}
    lab = [s for s in ok if s["phi"] in (0, 1)]
    if len({s["phi"] for s in lab}) == 2:
        out["auroc_ccs_vs_phi"] = float(auroc(np.array([s["ccs"] for s in lab]), np.array([s["phi"] for s in lab])))
        out["auroc_graded_vs_phi"] = float(auroc(np.array([s["graded"] for s in lab]),
                                                 np.array([s["phi"] for s in lab])))
    ver = [r for r in records if r.verified]
    out["necessary_rate"] = float(np.mean([r.necessary for r in ver])) if ver else float("nan")
    out["samples"] = samples
    return out


# ----------------------------------------------------------------------------------------------
# System-1 audit
# ----------------------------------------------------------------------------------------------


#: the preserving views generated from a prompt of their own (sift.corpus.axes, registration order)
PRESERVING = tuple(generated_axes(("preserving",)))


def run_system1(prepared: Sequence[Prepared], *, n_bins: int = 10, n_resamples: int = 1000, seed: int = 0,
                space: str = "the domain's answer space") -> dict:
    """Calibration of the answer distribution (top-label, gold correctness), the entropy confidence, flip rates
    between the base view and each preserving view of the same item and model, and guard metrics of
    1 − max p as a flag of unfaithful (φ* = 0) traces."""
    from sift.companion import system1 as S

    if not prepared:
        raise SiftError("system1: no traces")
    conf = np.array([p.full_probs.max() for p in prepared])
    correct = np.array([float(p.space[p.pred] == p.trace.get("gold_answer", p.trace["answer"])) for p in prepared])
    ent = np.array([S.confidence_entropy(p.full_probs[None])[0] for p in prepared])
    brier = float(np.mean([S.brier_score(p.full_probs[None], [p.space.index(p.trace["gold_answer"])])
                           for p in prepared if p.trace.get("gold_answer") in p.space]))
    out: dict[str, Any] = {"config": {"n_bins": n_bins, "n_resamples": n_resamples, "seed": seed,
                                      "confidence": f"top-label max p over {space}",
                                      "bins": "equal-width right-closed (Guo) and equal-mass (stable sort)"},
                           "n": len(prepared), "accuracy": float(correct.mean()), "mean_confidence": float(conf.mean())}
    ew = S.calibration_error(conf, correct, n_bins=n_bins, binning="width")
    em = S.calibration_error(conf, correct, n_bins=n_bins, binning="mass")
    items = np.array([str(p.trace["base_item"]) for p in prepared])  # the CIs' unit: the base item
    ci_w = S.ece_ci(conf, correct, n_bins=n_bins, binning="width", n_resamples=n_resamples, seed=seed, groups=items)
    ci_m = S.ece_ci(conf, correct, n_bins=n_bins, binning="mass", n_resamples=n_resamples, seed=seed, groups=items)
    ea = S.e_aurc(conf, correct)
    out.update({"ece_w": ew.ece, "ece_w_ci": [ci_w.low, ci_w.high], "mce_w": ew.mce, "ece_m": em.ece,
                "ece_m_ci": [ci_m.low, ci_m.high], "brier": brier,
                "auroc_p": S.selective_auroc(correct, conf), "auroc_c": S.selective_auroc(correct, ent),
                "e_aurc": ea.e_aurc, "aurc": ea.aurc, "mean_entropy_confidence": float(ent.mean()),
                "reliability": {"bin_sizes": ew.bin_sizes.tolist(), "bin_accuracy": ew.bin_accuracy.tolist(),
                                "bin_confidence": ew.bin_confidence.tolist()}})
    # flips across preserving views (decisions against the model's own base decision, not the gold label)
    base = {(p.trace["family"], p.trace["base_item"]): p for p in prepared if p.trace["condition"] == "base"}
    flips = {}
    for cond in PRESERVING:
        pairs = [(base[(p.trace["family"], p.trace["base_item"])], p) for p in prepared
                 if p.trace["condition"] == cond and (p.trace["family"], p.trace["base_item"]) in base]
        if pairs:
            fr = float(np.mean([a.key(a.pred) != b.key(b.pred) for a, b in pairs]))
            # TV over the candidates both views share (a real LM's views of an item may offer different ones)
            same = [(a, b) for a, b in pairs if sorted(map(a.key, range(len(a.space)))) ==
                    sorted(map(b.key, range(len(b.space))))]
            tv = [0.5 * sum(abs(dict(zip(map(a.key, range(len(a.space))), a.full_probs))[k] - pb)
                            for k, pb in zip(map(b.key, range(len(b.space))), b.full_probs)) for a, b in same]
            flips[cond] = {"n": len(pairs), "flip_rate": fr, "tv": float(np.mean(tv)) if tv else float("nan"),
                           "tv_n": len(same)}
    out["flips"] = flips
    lab = [(p.phi, 1 - p.full_probs.max(), str(p.trace["base_item"])) for p in prepared if p.phi in (0, 1)]
    if len({x for x, _, _ in lab}) == 2:
        y = np.array([x == 0 for x, _, _ in lab])
        g = S.guard_metrics(y, np.array([s for _, s, _ in lab]), threshold=0.5, groups=[i for _, _, i in lab],
                            n_resamples=n_resamples, seed=seed)
        out["guard"] = {"positives": "phi*=0 traces", "score": "1 - max p", "auroc": g.auroc, "pr_auc": g.pr_auc,
                        "tpr": g.tpr, "fpr": g.fpr, "tpr_ci": list(g.tpr_ci), "fpr_ci": list(g.fpr_ci),
                        "recall_at_zero_false_alarms": g.recall_at_zero_false_alarms, "n_pos": g.n_pos,
                        "n_neg": g.n_neg, "ci_unit": g.ci_unit}
    return out
