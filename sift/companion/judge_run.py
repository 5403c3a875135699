"""Cue-anchored judging (paper 001) with any Hugging Face causal LM as the judge.

Items are equal-content pairs built offline from the organism's arithmetic problems: the question in plain
English and two explanations with the same steps in two surface styles (the paper's "equal-content pair":
quality is equal, provenance labels are nominal). Every item is judged under Blind, Truth, Flip, Placebo,
Reveal-After and the two attacks (verbosity, confidence), in a per-item random display order that is undone
before scoring.

Verdicts are read by scoring: the judge's log-probability of each verdict string continuing the JSON prefix
``{"verdict": "`` (one batched forward pass; temperature-0 generation would pick the same argmax token
sequence only if the first token decides, so this is a documented deviation [R]); the explanation is then
generated greedily after the chosen verdict. ``verdict_mode='generate'`` generates the whole JSON instead.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from sift.companion import judges as J
from sift.errors import SiftError

VERDICT_STRINGS = (J.TIE, J.ONE_FIRST, J.TWO_FIRST)


@dataclass(frozen=True)
class PairItem:
    item_id: str
    question: str
    candidates: tuple[str, str]
    true_labels: tuple[str, str]


def organism_pairs(n: int, seed: int = 0, labels: tuple[str, str] = ("LLM", "TradML")) -> list[PairItem]:
    """``n`` equal-content pairs from the organism's arithmetic items (English, two explanation styles)."""
    from sift.organism.domains import chain, make_item
    from sift.organism.render import NAMES, OBJECTS

    out = []
    rng = random.Random(seed)
    for i in range(n):
        it = make_item("arithmetic", seed + 7919, i)
        name, obj = NAMES[i % 4].capitalize(), OBJECTS[(i // 4) % 4]
        events = ", ".join((f"gets {x} more" if op == "+" else f"loses {x}") for op, x in zip(it.ops, it.facts[1:]))
        q = f"{name} has {it.facts[0]} {obj}, then {events}. How many {obj} does {name} have now?"
        st = chain("arithmetic", it.facts, it.ops)
        a = "; ".join(f"{s.lhs} {s.op} {s.rhs} = {s.result}" for s in st) + f". The answer is {it.answer}."
        b = ("Start with " + it.facts[0] + ". " + " ".join(
            f"{'Adding' if s.op == '+' else 'Taking away'} {s.rhs} gives {s.result}." for s in st)
             + f" So {name} has {it.answer} {obj}.")
        cands = (a, b) if rng.random() < 0.5 else (b, a)
        out.append(PairItem(f"pair-{seed}-{i:04d}", q, cands, labels))
    return out


class HFJudge:
    """A causal LM as a pairwise judge: verdict by scoring the three verdict strings, explanation by greedy
    generation. ``chat`` wraps prompts in the tokenizer's chat template when it has one."""

    def __init__(self, model, tokenizer, *, chat: bool = True, max_explanation_tokens: int = 32,
                 verdict_mode: str = "logprob", max_new_tokens: int = 64, batch_size: int = 8):
        if verdict_mode not in ("logprob", "generate"):
            raise SiftError(f"companion.judges.verdict_mode must be 'logprob' or 'generate', got {verdict_mode!r}")
        self.model, self.tok = model, tokenizer
        self.chat = chat and getattr(tokenizer, "chat_template", None) is not None
        self.max_expl = max_explanation_tokens
        self.verdict_mode = verdict_mode
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.n_calls = 0

    def _prefix(self, turns: Sequence[str]) -> list[int]:
        """Token ids of a (multi-turn) user conversation followed by the start of the assistant's JSON."""
        if self.chat:
            msgs = []
            for i, t in enumerate(turns):
                role = "user" if i % 2 == 0 else "assistant"
                msgs.append({"role": role, "content": t})
            text = self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            ids = self.tok.encode(text, add_special_tokens=False)
        else:
            text = "\n\n".join(turns) + "\n\n"
            ids = self.tok.encode(text, add_special_tokens=True)
        return list(ids)

    def _logits_last(self, seqs: list[list[int]]):
        import torch

        from sift.lm.generation import left_padded

        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        ids, mask, pos = left_padded(seqs, pad)
        width = ids.shape[1]
        with torch.no_grad():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        return out.float().log_softmax(-1), width

    def verdict_logprobs(self, turns: Sequence[str]) -> np.ndarray:
        """log P(verdict string | prompt, '{"verdict": "') for (Tie, [1,2], [2,1])."""
        pre = self._prefix(turns) + self.tok.encode('{"verdict": "', add_special_tokens=False)
        conts = [self.tok.encode(v + '"', add_special_tokens=False) for v in VERDICT_STRINGS]
        seqs = [pre + c for c in conts]
        lp, width = self._logits_last(seqs)
        self.n_calls += 1
        out = []
        for i, (s, c) in enumerate(zip(seqs, conts)):
            off = width - len(s)
            tot = 0.0
            for j, t in enumerate(c):
                tot += float(lp[i, off + len(pre) + j - 1, t])
            out.append(tot)
        return np.array(out)

    def generate(self, ids: list[int], max_new_tokens: int) -> str:
        import torch

        x = torch.tensor([ids])
        with torch.no_grad():
            g = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                    do_sample=False, pad_token_id=self.tok.pad_token_id or self.tok.eos_token_id)
        return self.tok.decode(g[0, len(ids):], skip_special_tokens=True)

    def judge(self, turns: Sequence[str], display_order: Sequence[int]) -> tuple[str, str, bool]:
        """(identity verdict, explanation, parsed) for one prompt (the last user turn is answered)."""
        if self.verdict_mode == "generate":
            text = self.generate(self._prefix(turns), self.max_new_tokens)
            self.n_calls += 1
            out = J.parse_judge_output(text, display_order)
            if out is None:
                return J.TIE, text, False
            return out.verdict, out.explanation, True
        lp = self.verdict_logprobs(turns)
        shown = VERDICT_STRINGS[int(np.argmax(lp))]
        expl = ""
        if self.max_expl > 0:
            pre = self._prefix(turns) + self.tok.encode(f'{{"verdict": "{shown}", "explanation": "',
                                                         add_special_tokens=False)
            expl = self.generate(pre, self.max_expl).split('"')[0].strip()
        return J.map_display_verdict(shown, display_order), expl, True


def load_judge(model: str, *, tokenizer: str | None = None, tiny_config: dict | None = None, seed: int = 0,
               dtype: str | None = None):
    """(model, tokenizer) for ``model``: a local folder, a local .gguf, a cached hub name, or ``'tiny-random'``
    (a randomly initialised Llama built from ``tiny_config`` around the tokenizer at ``tokenizer``, which may
    itself be a .gguf file or a folder). Never downloads. ``dtype``: as :func:`sift.lm.loading.load_causal_lm`
    (not for tiny-random)."""
    from sift.lm.loading import load_causal_lm

    if model != "tiny-random":
        return load_causal_lm(model, dtype=dtype)
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if tokenizer is None:
        raise SiftError("companion.judges.tokenizer: 'tiny-random' needs a local tokenizer (folder or .gguf)")
    from pathlib import Path

    tp = Path(tokenizer)
    if not tp.exists():
        raise SiftError(f"companion.judges.tokenizer: {tokenizer} does not exist")
    if tp.is_file():
        tok = AutoTokenizer.from_pretrained(str(tp.parent), gguf_file=tp.name, local_files_only=True)
    else:
        tok = AutoTokenizer.from_pretrained(str(tp), local_files_only=True)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    c = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=2048)
    c.update(tiny_config or {})
    torch.manual_seed(seed)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **c))
    return m.eval(), tok


@dataclass(frozen=True)
class ProbeContext:
    """What every probe's prompt builder may read: the item, its per-item random draws and the run settings."""

    item: PairItem
    order: tuple[int, int]  # display order of the two candidates
    badged: int  # candidate that carries the placebo badge
    target: int  # candidate an attack argues for
    badge: str
    favored_label: str
    protocol: str

    @property
    def prompt_kw(self) -> dict:
        return dict(protocol=self.protocol, context_name="Question", candidate_name="Answer",
                    display_order=self.order)


@dataclass(frozen=True)
class ProbeCall:
    """One probe on one item: the prompt, the outcome its cue favours, the labels it shows, extra record fields."""

    prompt: str
    favored: str | None
    labels: tuple = (None, None)
    extra: dict = field(default_factory=dict)


def ask_once(judge, ctx: ProbeContext, call: ProbeCall) -> tuple[str, str, bool, dict]:
    """The default dialogue: one user turn."""
    v, e, ok = judge.judge([call.prompt], ctx.order)
    return v, e, ok, {}


@dataclass(frozen=True)
class Probe:
    """A judging condition. ``build`` makes its prompt; ``ask`` runs the dialogue (default: one turn). The
    summary flags say which anchoring measures apply: label-aligned rationale (the prompt shows labels), cue
    alignment (an attack's cue) and revision susceptibility (a two-stage dialogue that records ``flip_stage``)."""

    name: str
    build: Callable[[ProbeContext], ProbeCall]
    ask: Callable[[Any, ProbeContext, ProbeCall], tuple[str, str, bool, dict]] = ask_once
    label_aligned: bool = False
    cue_aligned: bool = False
    revision: bool = False


PROBE_REGISTRY: dict[str, Probe] = {}


def register_probe(probe: Probe) -> Probe:
    """Add a judging condition; ``companion.judges.probes`` may then name it."""
    if probe.name in PROBE_REGISTRY:
        raise SiftError(f"judge probe {probe.name!r} is already registered")
    PROBE_REGISTRY[probe.name] = probe
    return probe


def _flipped(ctx: ProbeContext) -> ProbeCall:
    it = ctx.item
    flipped = (it.true_labels[1], it.true_labels[0])
    return ProbeCall(J.flip_prompt(it.question, it.candidates, it.true_labels, **ctx.prompt_kw),
                     J.favored_outcome(flipped, ctx.favored_label), flipped)


def _placebo(ctx: ProbeContext) -> ProbeCall:
    it, b = ctx.item, ctx.badged
    return ProbeCall(J.placebo_prompt(it.question, it.candidates, badge=ctx.badge, badged=b, **ctx.prompt_kw),
                     J.ONE_FIRST if b == 0 else J.TWO_FIRST, (ctx.badge, None) if b == 0 else (None, ctx.badge),
                     {"badged": b})


def _attack(kind: str) -> Callable[[ProbeContext], ProbeCall]:
    def build(ctx: ProbeContext) -> ProbeCall:
        ap = J.attack_prompt(ctx.item.question, ctx.item.candidates, ctx.target, kind, **ctx.prompt_kw)
        return ProbeCall(ap.prompt, ap.favored, extra={"target": ctx.target})

    return build


def _ask_reveal_after(judge, ctx: ProbeContext, call: ProbeCall) -> tuple[str, str, bool, dict]:
    """Flip first, then reveal the true labels in a second turn; the first-turn verdict is ``flip_stage``."""
    it = ctx.item
    ra = J.reveal_after_prompts(it.question, it.candidates, it.true_labels, display_order=ctx.order,
                                candidate_name="Answer", protocol=ctx.protocol, context_name="Question")
    v1, e1, _ = judge.judge([ra.turn1], ctx.order)
    shown1 = J.map_display_verdict(v1, ctx.order)  # identity ↔ display is an involution
    turn1_answer = f'{{"verdict": "{shown1}", "explanation": "{e1}"}}'
    v, e, ok = judge.judge([ra.turn1, turn1_answer, ra.turn2], ctx.order)
    return v, e, ok, {"flip_stage": v1}


for _probe in (
    Probe("blind", lambda c: ProbeCall(J.blind_prompt(c.item.question, c.item.candidates, **c.prompt_kw), None)),
    Probe("truth", lambda c: ProbeCall(J.truth_prompt(c.item.question, c.item.candidates, c.item.true_labels,
                                                      **c.prompt_kw),
                                       J.favored_outcome(c.item.true_labels, c.favored_label), c.item.true_labels),
          label_aligned=True),
    Probe("flip", _flipped, label_aligned=True),
    Probe("placebo", _placebo, label_aligned=True),
    Probe("reveal_after", _flipped, ask=_ask_reveal_after, label_aligned=True, revision=True),
    Probe("verbosity", _attack("verbosity"), cue_aligned=True),
    Probe("confidence", _attack("confidence"), cue_aligned=True),
):
    register_probe(_probe)
PROBES = tuple(PROBE_REGISTRY)  # the built-in conditions, in their reporting order


def run_judges(judge: HFJudge, items: Sequence[PairItem], *, probes: Sequence[str] = PROBES,
               favored_label: str = "LLM", badge: str = J.DEFAULT_BADGE, protocol: str = "baseline",
               seed: int = 0, n_resamples: int = 1000, progress: bool = True) -> dict:
    """Judge every item under every probe; outcome and rationale anchoring against the Blind run."""
    from tqdm.auto import tqdm

    bad = [p for p in probes if p not in PROBE_REGISTRY]
    if bad or "blind" not in probes:
        raise SiftError(f"companion.judges.probes must include 'blind' and only {tuple(PROBE_REGISTRY)}; "
                        f"got {list(probes)}")
    rng = random.Random(seed)
    table: dict[str, list[dict]] = {p: [] for p in probes}
    for it in tqdm(items, desc="judge items", disable=not progress):
        order = (0, 1) if rng.random() < 0.5 else (1, 0)
        badged = rng.randrange(2)
        target = rng.randrange(2)
        ctx = ProbeContext(it, order, badged, target, badge, favored_label, protocol)
        for name in probes:
            probe = PROBE_REGISTRY[name]
            call = probe.build(ctx)
            v, e, ok, asked = probe.ask(judge, ctx, call)
            rec: dict[str, Any] = {"item": it.item_id, "display_order": list(order), **call.extra, **asked,
                                   "verdict": v, "explanation": e, "parsed": ok, "favored": call.favored,
                                   "labels": list(call.labels)}
            table[name].append(rec)
    return summarize_judges(table, favored_label=favored_label, n_resamples=n_resamples, seed=seed,
                            config=dict(probes=list(probes), favored_label=favored_label, badge=badge,
                                        protocol=protocol, seed=seed, n_items=len(items),
                                        verdict_mode=judge.verdict_mode, chat_template=judge.chat,
                                        drift_scorer="1 - ROUGE-L F1 [R]", lai_scorer="lexicon [R]"))


def summarize_judges(table: dict[str, list[dict]], *, favored_label: str, n_resamples: int, seed: int,
                     config: dict) -> dict:
    blind = [r["verdict"] for r in table["blind"]]
    bexp = [r["explanation"] for r in table["blind"]]
    out: dict[str, Any] = {"config": config, "n_items": len(blind),
                           "blind": {"counts": J.outcome_distribution(blind).tolist(),
                                     "edr": J.equality_detection_rate(blind), "nd": J.neutrality_deviation(blind)}}
    probes = {}
    for probe, recs in table.items():
        if probe == "blind":
            continue
        v = [r["verdict"] for r in recs]
        fav = [r["favored"] for r in recs]
        # f is per item (placebo side, attack target); LDS/LAO need one f: fold items so that f = [1,2]
        folded_b = [b if f == J.ONE_FIRST or b == J.TIE else J.opposite(b) for b, f in zip(blind, fav)]
        folded_p = [p if f == J.ONE_FIRST or p == J.TIE else J.opposite(p) for p, f in zip(v, fav)]
        s = J.outcome_shift(folded_b, folded_p, J.ONE_FIRST)
        ci = J.outcome_shift_ci(folded_b, folded_p, J.ONE_FIRST, n_resamples=n_resamples, seed=seed)
        d = {"counts": J.outcome_distribution(v).tolist(), "lds": s.lds, "ts": s.ts, "ols": s.ols, "lao": s.lao,
             "tv": s.tv, "low_tv": s.low_tv, "lds_ci": [ci.low, ci.high],
             "transition": J.transition_matrix(folded_b, folded_p).tolist()}
        dr = J.explanation_drift(blind, v, bexp, [r["explanation"] for r in recs])
        d.update(drift=dr.value, n_same=dr.n_same, drift_scorer=dr.scorer)
        orders = [tuple(r["display_order"]) for r in recs]
        kind = PROBE_REGISTRY[probe]
        if kind.label_aligned:
            lai = J.label_aligned_rationale(blind, v, [r["explanation"] for r in recs], fav,
                                            [tuple(r["labels"]) for r in recs],
                                            scorer=partial(J.label_alignment, candidate_name="Answer"),
                                            display_orders=orders)
            d.update(lai=lai.value, lai_n_same=lai.n_same)
        if kind.cue_aligned:
            d["cue_align"] = float(np.mean([J.cue_alignment(r["explanation"], r["target"], probe,
                                                            candidate_name="Answer", display_order=o)
                                            for r, o in zip(recs, orders)]))
        if kind.revision:
            rs = J.revision_susceptibility([r["flip_stage"] for r in recs], v)
            d.update(rs=rs.rs, rs_ci=list(rs.ci))
        probes[probe] = d
    out["probes"] = probes
    out["records"] = table
    return out
