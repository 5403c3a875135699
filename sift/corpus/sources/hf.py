"""The FaithShift corpus on real Hugging Face causal LMs (docs/design.md §2–§4), same files as the organism's.

Items come from reasoning-gym or from local GSM8K / MATH / CommonsenseQA / BBH files
(:mod:`sift.lm.items`); one or two models load through :func:`sift.lm.loading.load_causal_lm` (the second
gives the model-family axis). Per model and chunk of base items:

1. **generate** base, paraphrase (another question wrapper), hint_format (the base cue in another format),
   budget (terse ↔ verbose) — batched, left-padded, KV cache, greedy or seeded sampling;
2. **verify** every trace by interventions on the model that wrote it (:mod:`sift.corpus.real_labels`):
   *edit* — the CoT's own stated result (:func:`sift.lm.edit_targets.result_span`: the last equation's
   result or conclusion value, never a step label, premise or quoted cue) and every restatement of it
   (:func:`sift.lm.edit_targets.restatement_spans`) are replaced, the CoT kept token for token before them,
   ``Answer:`` forced and a few answer tokens decoded greedily and parsed; *cue change* — the cue's value in the
   prompt replaced, the generated CoT ids kept; *adding a mistake* — an earlier computed value corrupted and the
   rest of the CoT generated again; *rationalisation* — where the CoT states the cue's value as its own result,
   the CoT generated again under another cue value; then φ* by :func:`sift.corpus.real_labels.label_trace`.
   The necessity tests — no CoT, and early answering with the CoT cut at 1/3 and 2/3, the answer forced —
   give ``cot_necessary`` (:func:`sift.corpus.real_labels.cot_necessary`), recorded beside φ*;
3. **altering conditions** on verified bases: cue_injection (a decisive cue toward a wrong answer, on bases
   verified φ*=1), cue_verbalization (the "if you use a hint, say so" instruction, on bases verified φ*=0 that
   carry a cue), causal_truncation (Lanham et al.: the base CoT cut before its last reasoning line, the
   answer forced and re-decoded; on bases verified φ*=1); these are verified the same way.

step_reordering and language do not apply to generic items: they are listed in the manifest as not
applicable, with 0 pairs built. A real LM has no construction intent for base and preserving traces, so their
``intended_phi`` is None (the manifest's intent agreement counts only traces with an intent); an altering
trace's intent is the axis's target label.

``prompt_ids`` and ``generated_ids`` are the exact ids (hidden states are later extracted from them);
``cot_span`` is in generated-token units. Chunks are written atomically under ``<out>/.parts`` and reused on
a rerun with the same config; ``traces.jsonl``, ``pairs.jsonl`` and ``manifest.json`` are written last.
"""

from __future__ import annotations

import hashlib
import inspect
import random
import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from tqdm import tqdm

from sift import __version__
from sift.corpus.axes import AXES, generated_axes
from sift.corpus.chunk import TRUNCATION, build_chunk
from sift.corpus.config import HFCorpusConfig
from sift.corpus.manifest import build_manifest
from sift.corpus.pairs import build_pairs
from sift.corpus.real_labels import (
    RULES,
    LabelPolicy,
    agreement_by_model_and_domain,
    cot_necessary,
    label_summary,
    label_trace,
    verdicts,
)
from sift.corpus.sources import register_source
from sift.corpus.store import engine_config, run_chunks, write_corpus
from sift.corpus.verify import Probe, Rewrite, Trace
from sift.errors import SiftError
from sift.lm.edit_targets import EditTarget, computed_values, intermediate_spans, restatement_spans, result_span
from sift.lm.items import LMItem, load_item_specs
from sift.lm.loading import model_name, resolve_dtype
from sift.lm.parsing import answer_line_start, normalize_number, parse_answer
from sift.lm.prompts import ANSWER_PREFIX, BUDGETS, DECISIVE_FORMAT, TEMPLATES, LMView, cue_formats_for, mentions_cue
from sift.lm.prompts import prompt_ids as render_prompt_ids
from sift.lm.views import shown_item
from sift.lm.weights import release_memory
from sift.provenance import config_hash, model_fingerprint

#: bump when generation or verification changes the records, so that stale chunks are not reused
# 4: φ* from the read tests, cot_necessary, restatements, golds checked; 5: magnitudes, cut answers
PIPELINE_VERSION = 6

# ------------------------------------------------------------------------------------------------- model side

class LMSource:
    """A loaded HF causal LM with the text/id interface the corpus needs."""

    def __init__(self, family: str, model, tokenizer, model_id: str, *, batch_size: int = 8,
                 system_prompt: str | None = None, backend: str = "hf", device: str = "cpu",
                 dtype: str | None = None, response_prefix: str = "", model_name: str | None = None):
        from sift.lm.generation import make_backend

        self.family, self.model, self.tokenizer, self.model_id = family, model, tokenizer, model_id
        self.model_name = model_name or model_id  # what traces call the model (never a local path)
        self.batch_size, self.system_prompt, self.response_prefix = batch_size, system_prompt, response_prefix
        if tokenizer.pad_token_id is None:
            raise SiftError(f"model {model_id}: the tokenizer has neither a pad nor an eos token")
        # free generation goes through the backend (hf, vllm or llamacpp: these two read model_id, the name or the
        # .gguf file given); answer re-decodes and the interventions that write again (self.greedy, sampling too
        # when the traces sample) stay in transformers, so labels never depend on the generation backend
        self.backend = make_backend(backend, model_id, model, tokenizer, batch_size=batch_size, device=device,
                                    dtype=dtype)
        self.greedy = make_backend("hf", model_id, model, tokenizer, batch_size=batch_size, device=device,
                                   dtype=dtype) if backend != "hf" else self.backend

    @classmethod
    def load(cls, family: str, name_or_path: str, *, device: str = "cpu", dtype: str | None = None,
             batch_size: int = 8, system_prompt: str | None = None, backend: str = "hf",
             response_prefix: str = "") -> LMSource:
        from sift.lm.loading import load_causal_lm, model_name

        model, tok = load_causal_lm(name_or_path, device=device, dtype=dtype)
        return cls(family, model, tok, name_or_path, batch_size=batch_size, system_prompt=system_prompt,
                   backend=backend, device=device, dtype=dtype, response_prefix=response_prefix,
                   model_name=model_name(name_or_path))

    def prompt_ids(self, item: LMItem, view: LMView) -> list[int]:
        return render_prompt_ids(self.tokenizer, item, view, self.system_prompt, self.response_prefix)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def answer_prefix(self, cot_text: str) -> list[int]:
        """Ids of the forced answer line start: ``Answer:`` on a new line after the CoT."""
        sep = "" if not cot_text or cot_text.endswith("\n") else "\n"
        return self.encode(sep + ANSWER_PREFIX)

    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0, seeds: Sequence[int] | None = None,
                 desc: str | None = None, backend=None) -> list[list[int]]:
        """New ids per prompt in input order (the backend batches by length); ``seeds``: one per prompt when
        sampling, so that a trace's sample does not depend on its batch."""
        backend = backend or self.backend
        # all prompts sorted by length first (a batch decodes until its longest member ends, and prompts of one
        # length are mostly items of one kind, with similar reply lengths), then progress in blocks of batches
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[list[int] | None] = [None] * len(prompts)
        step = max(self.batch_size * 4, 1)
        for s in tqdm(range(0, len(order), step), desc=desc, disable=desc is None or len(order) <= step,
                      leave=False):
            idx = order[s:s + step]
            got = backend.generate([prompts[i] for i in idx], max_new_tokens=max_new_tokens, do_sample=do_sample,
                                   temperature=temperature, top_p=top_p,
                                   seeds=None if seeds is None else [seeds[i] for i in idx])
            for i, g in zip(idx, got):
                out[i] = g
        return out  # type: ignore[return-value]

    def redecode(self, prefixes: Sequence[Sequence[int]], kinds: Sequence[str], n_tokens: int,
                 choices: Sequence[Any] | None = None) -> list[tuple[str | None, list[int]]]:
        """Greedy answer after each forced-answer prefix: (parsed answer of its first line, the ids). A first line
        the token limit cut while it wrote a number ("Answer: 5812 + 23 = 5" at 12 tokens) has no answer: its last
        number may be cut, so it gives (None, []) and nothing of it is kept."""
        outs = self.generate(prefixes, max_new_tokens=n_tokens, backend=self.greedy) if prefixes else []
        res = []
        for k, ids in enumerate(outs):
            text = self.decode(ids)
            first = re.match(r"\s*[^\n]*", text).group(0)
            if cut_at_limit(ids, text, n_tokens):
                res.append((None, []))
                continue
            ch = choices[k] if choices else None
            res.append((parse_answer(ANSWER_PREFIX + first, kinds[k], choices=ch), ids))
        return res


def cut_at_limit(ids: Sequence[int], text: str, n_tokens: int) -> bool:
    """Whether a re-decoded answer reached the token limit inside its first line, writing a number."""
    return len(ids) >= n_tokens and "\n" not in text.lstrip() and re.search(r"\d[ \t]*$", text) is not None


def token_index(src: LMSource, ids: Sequence[int], char_pos: int, text: str | None = None) -> int:
    """The largest k with decode(ids[:k]) a prefix of decode(ids) no longer than ``char_pos`` characters."""
    text = src.decode(ids) if text is None else text
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(src.decode(ids[:mid])) <= char_pos:
            lo = mid
        else:
            hi = mid - 1
    while lo > 0 and not text.startswith(src.decode(ids[:lo])):
        lo -= 1
    return lo


# ------------------------------------------------------------------------------------------------- values

def _h(salt: str) -> int:
    return int(hashlib.sha256(salt.encode()).hexdigest(), 16)


def alternative(value: str, vkind: str, avoid: set, salt: str, labels: Sequence[str] = ()) -> str | None:
    """Another value of the same kind (deterministic in ``salt``), avoiding ``avoid``; None if there is none."""
    if vkind == "boolean":
        options = [v for v in ("True", "False") if v != value and v not in avoid]
    elif vkind == "choice":
        options = [lab for lab in labels if lab != value and lab not in avoid]
    elif vkind == "numeric":
        deltas = [d for k in range(1, 10) for d in (k, -k)]
        if "/" in value:
            num, den = value.split("/")
            cands = [normalize_number(f"{int(num) + d}/{den}") for d in deltas]
        else:
            is_int = re.fullmatch(r"-?\d+", value) is not None
            base = int(value) if is_int else float(value)
            cands = [str(base + d) if is_int else normalize_number(f"{base + d:.10f}") for d in deltas]
        options = [c for c in cands if c is not None and c != value and c not in avoid][:8]
    else:
        return None
    return options[_h(salt) % len(options)] if options else None


def _restyle(original: str, new: str, vkind: str) -> str:
    """``new`` written the way the CoT wrote the value it replaces (true→false, Yes→No)."""
    if vkind != "boolean":
        return new
    low = original.lower()
    word = ({"true": "false", "false": "true", "yes": "no", "no": "yes"}[low]
            if (low in ("true", "yes")) != (new == "True") else low)
    if original.isupper():
        return word.upper()
    return word.capitalize() if original[:1].isupper() else word


def _labels(item: LMItem) -> list[str]:
    return [lab for lab, _ in item.choices] if item.choices else []


def cue_value(item: LMItem, avoid: set, salt: str) -> str | None:
    """A cue value for an item: a wrong answer of the item's kind (free-form items take no cue)."""
    kind = item.answer_kind
    if kind == "free":
        return None
    return alternative(item.answer, kind, avoid | {item.answer}, salt, _labels(item))


# ------------------------------------------------------------------------------------------------- views

def base_view(item: LMItem, cfg: HFCorpusConfig) -> LMView:
    rng = random.Random(f"real-base:{cfg.seed}:{item.item_id}")
    view = LMView(template=rng.randrange(len(TEMPLATES)), budget=rng.choice(tuple(BUDGETS)))
    if item.answer_kind != "free" and rng.random() < cfg.cue.p_cue:
        fmt = rng.choice(cue_formats_for(item.answer_kind, cfg.cue_formats))
        correct = rng.random() < cfg.cue.p_cue_correct
        value = item.answer if correct else cue_value(item, set(), f"cue:{cfg.seed}:{item.item_id}")
        if value is not None:
            view = view.with_(cue_value=value, cue_format=fmt)
    return view


def phase1_conditions() -> list[str]:
    """The base and preserving axes a real LM generates: those that render an LM view."""
    return [c for c in generated_axes(("base", "preserving")) if AXES[c].applies_to_lm()]


#: why an axis renders no view for an item (counted per axis in the manifest)
NOT_APPLICABLE_REASONS = {
    "step_reordering": "no options, independent premises or additive terms to reorder",
    "language": "no translation with the same gold answer",
    "hint_format": "the base prompt carries no cue (or no other cue format is allowed)",
}


def axis_coverage(items: list[LMItem], cfg: HFCorpusConfig) -> dict[str, dict[str, Any]]:
    """Per generated preserving axis: on how many items it renders a view, and why not on the others."""
    bases = {it.item_id: base_view(it, cfg) for it in items}
    out: dict[str, dict[str, Any]] = {}
    for cond in generated_axes(("preserving",)):
        if cond not in cfg.conditions:
            continue
        if not AXES[cond].applies_to_lm():
            out[cond] = {"items": len(items), "not_applicable": len(items), "reason": "the axis has no real-LM view"}
            continue
        n = sum(phase1_view(it, bases[it.item_id], cond, cfg.seed, cfg.cue_formats) is None for it in items)
        out[cond] = {"items": len(items), "not_applicable": n,
                     "reason": NOT_APPLICABLE_REASONS.get(cond, "the axis renders no view") if n else None}
    return out


def phase1_view(item: LMItem, base: LMView, condition: str, seed: int,
                cue_formats: Sequence[str] | None = None) -> LMView | None:
    """The view of a base or preserving condition (:meth:`sift.corpus.axes.Axis.lm_view`); ``cue_formats`` go
    to the axes whose ``lm_view`` takes them (an axis that draws no cue may leave the argument out)."""
    rng = random.Random(f"real-cond:{seed}:{item.item_id}:{condition}")
    axis = AXES[condition]
    takes = cue_formats is not None and "cue_formats" in inspect.signature(axis.lm_view).parameters
    return axis.lm_view(item, base, rng, **({"cue_formats": cue_formats} if takes else {}))


# ------------------------------------------------------------------------------------------------- records

def trace_record(src: LMSource, item: LMItem, view: LMView, condition: str, prompt: list[int], new_ids: list[int],
                 cfg: HFCorpusConfig, chash: str) -> dict:
    """A trace in the organism's record schema (sift.corpus.sources.organism._trace_record); the gold answer and
    the parse are those of the item as the view shows it (options reordered: relabelled)."""
    item = shown_item(item, view)
    text = src.decode(new_ids)
    answer = parse_answer(text, item.answer_kind, choices=item.choices)
    start = answer_line_start(text)
    cot_end = len(new_ids) if start is None else token_index(src, new_ids, start, text)
    ax = AXES[condition]
    return {
        "trace_id": f"{src.family}|{item.item_id}|{condition}|{cfg.seed}",
        "base_item": item.item_id, "domain": item.domain, "model": src.model_name, "family": src.family,
        "condition": condition, "seed": cfg.seed, "view": view.to_dict(),
        "prompt": src.decode(prompt), "prompt_ids": list(prompt), "generated_ids": list(new_ids),
        "cot": src.decode(new_ids[:cot_end]), "cot_span": [0, cot_end], "answer": answer,
        "gold_answer": item.answer, "correct": answer == item.answer,
        "cue": None if view.cue_value is None else {"value": view.cue_value, "format": view.cue_format},
        "intended_phi": ax.direction[1] if ax.kind == "altering" else None,
        "provenance": {"config_hash": chash, "model_id": src.model_name, "seed": cfg.seed,
                       "sift_version": __version__},
    }


def _edited_ids(src: LMSource, cot_ids: list[int], cot: str, spans: Sequence[tuple[int, int, str]],
                stop: int | None = None) -> tuple[list[int], str]:
    """The CoT ids kept token for token up to the first span's start, then every ``cot[s:e]`` of ``spans``
    replaced by its text and the rest re-encoded (up to character ``stop`` of the edited text; None: all); also
    the edited text."""
    spans = sorted(spans)
    j = token_index(src, cot_ids, spans[0][0], cot)
    head = src.decode(cot_ids[:j])
    edited = cot
    for s, e, text in reversed(spans):
        edited = edited[:s] + text + edited[e:]
    return cot_ids[:j] + src.encode(edited[len(head):stop]), edited[:stop]


def _as_stated(target: EditTarget, text: str, new: str) -> str:
    """The edit's new value as a restatement writes it: a negative result restated by its magnitude ("late by 12
    minutes" after "30 - 42 = -12") gets the new value's magnitude."""
    if target.vkind == "numeric" and target.value.startswith("-") and not text.lstrip().startswith(("-", "\u2212")):
        return new.lstrip("-")
    return new


def _replacement(item: LMItem, cot: str, target: EditTarget, new: str) -> str:
    """``new`` written as the CoT wrote the value it replaces: an option stated by its text gets the other
    option's text, one stated by its label the other label (one statement may hold both: "(B) son")."""
    if target.vkind in ("choice", "choice_text"):
        said = cot[target.start:target.end].strip().upper()
        if item.choices and said not in {lab.upper() for lab, _ in item.choices}:
            return dict(item.choices)[new].strip().rstrip(".")
        return _restyle(cot[target.start:target.end], new, "choice")
    return _restyle(cot[target.start:target.end], new, target.vkind)


class LMVerifier:
    """A real LM's side of the one verification path (:class:`sift.corpus.verify.SourceVerifier`), with the
    corpus's tests and label policy: a CoT is its text; the stated result is :func:`result_span`'s (the last
    equation's result or conclusion value, never a step label, premise or quoted cue); answers are a few greedy
    tokens after a forced ``Answer:`` line, parsed; the further tests are early answering, an added mistake and
    the rationalisation test; the label rule is :func:`sift.corpus.real_labels.label_trace`."""

    def __init__(self, src: LMSource, cfg: HFCorpusConfig):
        self.src, self.cfg = src, cfg
        self.policy = LabelPolicy(label_forced=cfg.label_forced,
                                  rationalised_is_unfaithful=cfg.rationalised_is_unfaithful)

    def shown(self, item: LMItem, view: LMView) -> LMItem:
        return shown_item(item, view)

    def read(self, cot_ids: list[int]) -> str:
        return self.src.decode(cot_ids)

    def prompt_ids(self, item: LMItem, view: LMView) -> list[int]:
        return self.src.prompt_ids(item, view)

    def answer_prefix(self, cot: str) -> list[int]:
        return self.src.answer_prefix(cot)

    def mentions_cue(self, cot: str) -> bool:
        return mentions_cue(cot)

    def stated_result(self, t: Trace) -> EditTarget | None:
        shown, cot = t.shown, t.cot
        target = result_span(cot, shown.answer_kind, question=shown.question, labels=_labels(shown) or None,
                             choices=shown.choices)
        if isinstance(target, str):
            t.tests["no_target_reason"] = target
            return None
        t.tests.update(edit_span=[target.start, target.end], edit_original=cot[target.start:target.end],
                       edit_original_value=target.value, edit_target=target.how,
                       edit_spans=[list(sp) for sp in restatement_spans(cot, target, shown.question,
                                                                         _labels(shown) or None, shown.choices)])
        return target

    def edit_value(self, t: Trace) -> str | None:
        target, r = t.site, t.record
        akind = "choice" if target.vkind == "choice_text" else target.vkind
        return alternative(target.value, akind, {r["answer"], (r["cue"] or {}).get("value")},
                           f"edit:{r['trace_id']}", _labels(t.shown) or "ABCDE")

    def edited(self, t: Trace, value: str) -> tuple[list[int], str]:
        # the stated result and every restatement of it (sift.lm.edit_targets.restatement_spans), each written as
        # the CoT wrote it: a later sentence repeating the old value would contradict the edit
        target, cot = t.site, t.cot
        spans = [(s, e, _replacement(t.shown, cot, replace(target, start=s, end=e),
                                     _as_stated(target, cot[s:e], value))) for s, e in t.tests["edit_spans"]]
        return _edited_ids(self.src, t.cot_ids, cot, spans)

    def cue_change(self, t: Trace, edit_value: str | None) -> str | None:
        # the changed cue differs from the edit's value where the answer kind leaves room (a binary choice does
        # not): an answer that takes the one value could not tell which test it followed
        r, shown = t.record, t.shown
        cue, salt = r["cue"]["value"], f"cue:{r['trace_id']}"
        avoid = {r["answer"], t.site.value if t.site else None}
        return alternative(cue, shown.answer_kind, avoid | {edit_value}, salt, _labels(shown)) \
            or alternative(cue, shown.answer_kind, avoid, salt, _labels(shown))

    def more_tests(self, t: Trace, cue_value: str | None) -> tuple[list[Probe], list[Rewrite]]:
        """Early answering (re-decodes), an added mistake and the rationalisation test (rewrites), as
        ``cfg.interventions`` lists; none when the trace is ambiguous whatever they say."""
        r, cfg, src = t.record, self.cfg, self.src
        k, cot_ids, cot, target, tests = t.k, t.cot_ids, t.cot, t.site, t.tests
        probes: list[Probe] = []
        rewrites: list[Rewrite] = []
        forced_at_limit = bool(r.get("forced_answer")) and r["condition"] != "causal_truncation"
        if target is None or r["answer"] is None or (forced_at_limit and not cfg.label_forced):
            return probes, rewrites
        if "early" in cfg.interventions and len(cot_ids) >= 3:
            # the necessity tests: no CoT at all (0/3) and early answering at 1/3 and 2/3 (cot_necessary, not φ*)
            n = len(cot_ids)
            tests["early"] = [{"at": f"{i}/3", "tokens": round(n * i / 3), "answer": None} for i in (0, 1, 2)]
            for i, e in enumerate(tests["early"]):
                cut = cot_ids[:e["tokens"]]
                probes.append(Probe(k, f"early{i}", r["prompt_ids"] + cut + src.answer_prefix(src.decode(cut)),
                                    len(r["prompt_ids"])))
        if "mistake" in cfg.interventions:
            # values computed before the result is first stated (a restatement of it is the result, not a step)
            steps = intermediate_spans(cot, min(s for s, _ in tests["edit_spans"]))
            if steps:
                step = steps[-1]  # the last computed value before the result: the step the result is built on
                bad = alternative(step.value, "numeric", set(), f"mistake:{r['trace_id']}")
                if bad is not None:
                    text = _restyle(cot[step.start:step.end], bad, "numeric")
                    ids, head = _edited_ids(src, cot_ids, cot, [(step.start, step.end, text)],
                                            stop=step.start + len(text))
                    tests["mistake"] = {"span": [step.start, step.end], "original": cot[step.start:step.end],
                                        "original_value": step.value, "value": bad, "answer": None,
                                        "continuation": None, "repaired": None}
                    rewrites.append(Rewrite(k, "mistake", r["prompt_ids"] + ids, head))
        # the answer is the cue's value and the CoT states it as its own result, never naming the cue
        cue = (r["cue"] or {}).get("value")
        if "rationalised" in cfg.interventions and cue_value is not None \
                and target.value == cue == r["answer"] and not tests["mentions_cue"]:
            tests["rationalised"] = {"cue_value": cue_value, "cot_result": None, "mentions_cue": None, "moved": False,
                                     "cot": None}
            rewrites.append(Rewrite(k, "rationalised", src.prompt_ids(t.item, t.view.with_(cue_value=cue_value)), ""))
        return probes, rewrites

    def answers(self, probes: Sequence[Probe], records: Sequence[dict],
                shown: Sequence[LMItem]) -> list[tuple[str | None, list[int]]]:
        """One batched re-decode of ``answer_tokens`` greedy tokens per probe, its first line parsed."""
        return self.src.redecode([p.prefix for p in probes], [shown[p.k].answer_kind for p in probes],
                                 self.cfg.answer_tokens, [shown[p.k].choices for p in probes])

    def record_answer(self, probe: Probe, answer: str | None, tests: dict) -> None:
        tests["early"][int(probe.tag[-1])]["answer"] = answer

    def rewrite(self, rewrites: Sequence[Rewrite], records: Sequence[dict], shown: Sequence[LMItem],
                tests: Sequence[dict]) -> None:
        """The tests that let the model write again: the CoT after a corrupted step (``mistake``, its answer forced
        if it reaches the limit without one) and the CoT under a changed cue (``rationalised``)."""
        if not rewrites:
            return
        from sift.lm.generation import trace_seed

        src, cfg = self.src, self.cfg
        # decoded as the trace was: greedy, or sampled with the trace's own seed; in transformers (src.greedy)
        # whatever backend generated the traces, so that a label depends on the trace's ids only
        seeds = [trace_seed(records[w.k]["trace_id"].rsplit("|", 1)[0], cfg.seed) for w in rewrites] \
            if cfg.do_sample else None
        outs = src.generate([w.prompt for w in rewrites], max_new_tokens=cfg.max_new_tokens, do_sample=cfg.do_sample,
                            temperature=cfg.temperature, top_p=cfg.top_p, seeds=seeds, backend=src.greedy)
        force = []
        for w, ids in zip(rewrites, outs):
            item, t = shown[w.k], tests[w.k]
            text = src.decode(ids)
            if w.tag == "mistake":
                t["mistake"]["continuation"] = text
                # the model computed the corrupted step's true value again: it repaired the mistake
                t["mistake"]["repaired"] = t["mistake"]["original_value"] in computed_values(text)
                t["mistake"]["answer"] = parse_answer(text, item.answer_kind, choices=item.choices)
                if t["mistake"]["answer"] is None and answer_line_start(text) is None:
                    force.append(Probe(w.k, "mistake", w.prompt + ids + src.answer_prefix(w.head + text), 0))
                continue
            start = answer_line_start(text)
            cot2 = text if start is None else text[:start]
            res = result_span(cot2, item.answer_kind, question=item.question, labels=_labels(item) or None,
                              choices=item.choices)
            rat = t["rationalised"]
            rat.update(cot=cot2, mentions_cue=mentions_cue(cot2),
                       cot_result=None if isinstance(res, str) else res.value)
            rat["moved"] = rat["cot_result"] == rat["cue_value"] and not rat["mentions_cue"]
        for p, (ans, _) in zip(force, self.answers(force, records, shown) if force else []):
            tests[p.k]["mistake"].update(answer=ans, forced=True)

    def label(self, record: dict, tests: dict) -> tuple[int | None, dict]:
        """φ* and its reason (:func:`label_trace`); the trace's ``cot_necessary`` is set beside it."""
        forced = bool(record.get("forced_answer")) and record["condition"] != "causal_truncation"
        answer = record["answer"]
        phi, reason = label_trace(answer, tests, forced_at_limit=forced, policy=self.policy,
                                  cue=(record["cue"] or {}).get("value"))
        record["cot_necessary"] = cot_necessary(answer, tests)
        return phi, {"reason": reason, "rule": RULES[reason], **tests, "verdicts": verdicts(answer, tests),
                     "cot_necessary": record["cot_necessary"]}

    def last_step(self, record: dict, item: LMItem, cot_ids: list[int]) -> int | None:
        """The token where the CoT's last non-empty line starts (None with fewer than two lines)."""
        cot = self.src.decode(cot_ids)
        starts = [m.start() for m in re.finditer(r"^[ \t]*\S", cot, re.MULTILINE)]
        return token_index(self.src, cot_ids, starts[-1], cot) if len(starts) >= 2 else None


# ------------------------------------------------------------------------------------------------- chunks

def _generate_records(src: LMSource, jobs: list[tuple[LMItem, LMView, str]], cfg: HFCorpusConfig, chash: str,
                      desc: str) -> list[dict]:
    from sift.lm.generation import trace_seed

    prompts = [src.prompt_ids(it, v) for it, v, _ in jobs]
    seeds = [trace_seed(f"{src.family}|{it.item_id}|{c}", cfg.seed) for it, _, c in jobs] if cfg.do_sample else None
    outs = src.generate(prompts, max_new_tokens=cfg.max_new_tokens, do_sample=cfg.do_sample,
                        temperature=cfg.temperature, top_p=cfg.top_p, seeds=seeds, desc=desc)
    forced = force_answers(src, prompts, outs, cfg) if cfg.force_answer else set()
    records = [trace_record(src, it, v, c, p, o, cfg, chash) for (it, v, c), p, o in zip(jobs, prompts, outs)]
    for k, r in enumerate(records):
        r["forced_answer"] = k in forced
    return records


def force_answers(src: LMSource, prompts: list[list[int]], outs: list[list[int]], cfg: HFCorpusConfig) -> set[int]:
    """Budget forcing (Muennighoff et al. 2025, s1): a reply cut at ``max_new_tokens`` without an answer line gets
    the forced ``Answer:`` line and a greedy answer of ``answer_tokens`` tokens, as causal truncation does; the
    CoT stays as generated. ``outs`` is extended in place; returns the indices forced."""
    cut = [k for k, o in enumerate(outs) if len(o) >= cfg.max_new_tokens and answer_line_start(src.decode(o)) is None]
    if not cut:
        return set()
    heads = [outs[k] + src.answer_prefix(src.decode(outs[k])) for k in cut]
    got = src.generate([prompts[k] + h for k, h in zip(cut, heads)], max_new_tokens=cfg.answer_tokens,
                       backend=src.greedy)
    for k, h, g in zip(cut, heads, got):
        outs[k] = h + g
    return set(cut)


class LMChunk:
    """A real LM's side of the one chunk builder (:class:`sift.corpus.chunk.ChunkSource`): a real LM has no
    construction intent, so the altering axes start from the *verified* base labels (``labels_first``):
    cue_injection (a decisive cue toward a wrong answer) on bases verified φ*=1, cue_verbalization (the "say so"
    instruction) on cued bases verified φ*=0, causal_truncation on bases verified φ*=1."""

    labels_first = True

    def __init__(self, src: LMSource, cfg: HFCorpusConfig, chash: str):
        self.src, self.cfg, self.chash = src, cfg, chash
        self.verifier = LMVerifier(src, cfg)

    def phase1_jobs(self, items: Sequence[LMItem], conditions: Sequence[str]) -> list[tuple[LMItem, LMView, str]]:
        jobs = []
        for it in items:
            base = base_view(it, self.cfg)
            for cond in phase1_conditions():
                if cond in conditions:
                    v = phase1_view(it, base, cond, self.cfg.seed, self.cfg.cue_formats)
                    if v is not None:
                        jobs.append((it, v, cond))
        return jobs

    def view_of(self, job: tuple[LMItem, LMView, str]) -> LMView:
        return job[1]

    def generate(self, jobs: Sequence[tuple[LMItem, LMView, str]], desc: str) -> list[dict]:
        return _generate_records(self.src, list(jobs), self.cfg, self.chash, f"{self.src.family}: {desc}")

    def bases(self, records: Sequence[dict], views: Sequence[LMView],
              items: Sequence[LMItem]) -> list[tuple[dict, LMItem, LMView]]:
        """The verified base traces (an ambiguous base starts no altering trace)."""
        out = {r["base_item"]: (r, v) for r, v in zip(records, views) if r["condition"] == "base"}
        return [(out[it.item_id][0], it, out[it.item_id][1]) for it in items
                if it.item_id in out and out[it.item_id][0]["phi"] is not None]

    def altering_view(self, condition: str, base: dict, item: LMItem, view: LMView) -> LMView | None:
        phi = base["phi"]
        if condition == "cue_injection" and phi == 1:
            value = cue_value(item, {base["answer"], view.cue_value}, f"inject:{self.cfg.seed}:{item.item_id}")
            return None if value is None else view.with_(cue_value=value, cue_format=DECISIVE_FORMAT)
        if condition == "cue_verbalization" and phi == 0 and view.cue_value is not None:
            return view.with_(explain=True)
        if condition == TRUNCATION and phi == 1:
            return view
        return None

    def altering_job(self, condition: str, base: dict, item: LMItem, view: LMView) -> tuple[LMItem, LMView, str]:
        return item, view, condition

    def truncation_record(self, base: dict, item: LMItem, view: LMView, new_ids: list[int]) -> dict:
        return {**trace_record(self.src, item, view, TRUNCATION, base["prompt_ids"], new_ids, self.cfg, self.chash),
                "forced_answer": True}


def altering_eligibility(records: list[dict], families: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per altering axis: the verified bases it could start from, and why a base gave no shifted trace."""
    bases = [r for r in records if r["condition"] == "base" and r["family"] in families]
    built = Counter(r["condition"] for r in records)
    faithful = [r for r in bases if r["phi"] == 1]
    one_line = sum(len([ln for ln in r["cot"].splitlines() if ln.strip()]) < 2 for r in faithful)
    return {
        "cue_injection": {"eligible_bases": len(faithful), "built": built["cue_injection"],
                          "why_not": "bases verified φ*=1 only; none for a free-form answer"},
        "cue_verbalization": {"eligible_bases": sum(r["phi"] == 0 and r["cue"] is not None for r in bases),
                              "built": built["cue_verbalization"], "why_not": "cued bases verified φ*=0 only"},
        "causal_truncation": {"eligible_bases": len(faithful) - one_line, "built": built["causal_truncation"],
                              "why_not": f"bases verified φ*=1 whose CoT has two or more lines ({one_line} had one)"},
    }


def load_corpus_items(cfg: HFCorpusConfig, gold_report: dict[str, Any] | None = None) -> list[LMItem]:
    """The corpus's items, golds checked (``gold_report`` receives the check's counts per item source)."""
    items = load_item_specs(cfg.item_specs(), cfg.n_items, cfg.seed, gold_report=gold_report)
    ids = [it.item_id for it in items]
    if len(set(ids)) != len(ids):
        raise SiftError("item ids are not unique; give each record a distinct id")
    return items


#: the model loaded in this process, by family label: (corpus config hash, source); one at a time, so a chunk
#: worker keeps its model for its next chunks, and :func:`build_hf_corpus` drops it when it returns
_LOADED: dict[str, tuple[str, LMSource]] = {}


def lm_source(cfg: HFCorpusConfig, chash: str, k: int) -> LMSource:
    """Model ``k`` of ``cfg``, loaded once per process and corpus hash; any other model this process holds is
    freed first (one model resident per process)."""
    fam = cfg.labels()[k]
    if _LOADED.get(fam, ("",))[0] != chash:
        _LOADED.clear()
        release_memory()
        _LOADED[fam] = (chash, LMSource.load(fam, cfg.models[k], device=cfg.device, dtype=cfg.dtype,
                                             batch_size=cfg.batch_size, system_prompt=cfg.system_prompt,
                                             backend=cfg.backend, response_prefix=cfg.response_prefix))
    return _LOADED[fam][1]


class _OneAtATime(Mapping):
    """family → model, loading each when asked for (and freeing the one before): the models of ``cfg`` read one
    after the other, e.g. for the prompt-state pass, without two in memory."""

    def __init__(self, cfg: HFCorpusConfig, chash: str, given: Mapping[str, LMSource]):
        self.cfg, self.chash, self.given, self.labels = cfg, chash, given, cfg.labels()

    def __getitem__(self, fam: str) -> LMSource:
        if fam in self.given:
            return self.given[fam]
        if fam not in self.labels:
            raise KeyError(fam)
        return lm_source(self.cfg, self.chash, self.labels.index(fam))

    def __iter__(self):  # the model this process holds first: it is read before the others are loaded
        return iter(sorted(self.labels, key=lambda fam: fam not in _LOADED))

    def __len__(self) -> int:
        return len(self.labels)


def chunk_records(cfg: HFCorpusConfig, chash: str, k: int, chunk: list[LMItem],
                  sources: Mapping[str, LMSource] | None = None,
                  family_ids: frozenset[str] | None = None) -> list[dict]:
    """Model ``k``'s verified records of one chunk (a corpus job: picklable through ``functools.partial``);
    ``sources`` (family → model in memory) skip loading; ``family_ids``: the items the second model generates
    on (None: all)."""
    fam = cfg.labels()[k]
    conds = cfg.conditions if k == 0 or cfg.family_conditions == "all" else ["base"]
    mine = chunk if k == 0 or family_ids is None else [it for it in chunk if it.item_id in family_ids]
    if not mine:
        return []
    src = sources[fam] if sources and fam in sources else lm_source(cfg, chash, k)
    return build_chunk(LMChunk(src, cfg, chash), mine, conds)


def chunk_gpus(engine: DictConfig | None, device: str) -> int:
    """GPUs per chunk job: ``executor.gpus_per_job``, or with ``auto`` 1 when the models run on CUDA."""
    g = engine.executor.get("gpus_per_job", "auto") if engine is not None else "auto"
    if g == "auto":
        return int(str(device).startswith("cuda"))
    if isinstance(g, bool) or not isinstance(g, int) or g < 0:
        raise SiftError(f"executor.gpus_per_job: expected auto or an integer >= 0, got {g!r}")
    return g


def build_hf_corpus(cfg: HFCorpusConfig, out_dir: str | Path, progress: bool = True,
                      sources: dict[str, LMSource] | None = None,
                      engine: DictConfig | None = None) -> dict[str, Any]:
    """Generate, verify and pair on real LMs; write traces.jsonl, pairs.jsonl and manifest.json to ``out_dir``.

    ``sources`` (family label → :class:`LMSource`) skips loading, e.g. for models already in memory (the chunks
    then run in this process). ``engine`` (:func:`sift.corpus.store.engine_config`): where the chunks not yet
    built run, each job loading its models once (default: one after the other, here).
    """
    try:
        return _build_hf_corpus(cfg, Path(out_dir), progress, sources, engine)
    finally:
        _LOADED.clear()  # free the model this process loaded (a worker's stays until it exits)
        release_memory()


def _build_hf_corpus(cfg: HFCorpusConfig, out_dir: Path, progress: bool, sources: dict[str, LMSource] | None,
                       engine: DictConfig | None) -> dict[str, Any]:
    cfg.validate()
    from sift.lm.loading import check_model

    labels = cfg.labels()
    for fam, m in zip(labels, cfg.models):  # a missing, unreadable, non-GGUF or truncated model fails here,
        if not (sources and fam in sources):  # before any chunk job (a model passed in memory is not loaded)
            check_model(m)
    # model fingerprints (weights of a folder or file; the name for a cached hub model) are part of the key
    # ... and the resolved dtype (auto gives bfloat16 or float32 by hardware, with different ids)
    own = {k: v for k, v in asdict(cfg).items() if k != "family_workers"}  # how chunks run is not what they hold
    chash = config_hash({**own, "pipeline_version": PIPELINE_VERSION,
                         "models": [model_fingerprint(m) for m in cfg.models],
                         "dtype": resolve_dtype(cfg.dtype, cfg.device)})
    parts = out_dir / ".parts"
    parts.mkdir(parents=True, exist_ok=True)
    gold_report: dict[str, Any] = {}
    items = load_corpus_items(cfg, gold_report)
    chunks = [items[i:i + cfg.chunk_items] for i in range(0, len(items), cfg.chunk_items)]
    family_ids = None if cfg.family_items is None else frozenset(it.item_id for it in items[:cfg.family_items])
    if sources:
        if engine is not None and (engine.executor.kind != "local" or int(engine.workers) > 1):
            raise SiftError("build_hf_corpus: models passed in memory (sources) run in this process; "
                            "use executor=local workers=1, or pass no sources")
        build = partial(chunk_records, cfg, chash, sources=sources, family_ids=family_ids)
    else:
        build = partial(chunk_records, cfg, chash, family_ids=family_ids)
    engine = engine if engine is not None else engine_config()
    t_conv = time.time()
    if not sources:  # a GGUF file is converted here, once, before any worker could convert it beside another
        from sift.lm.loading import resolve_model_path

        for m in cfg.models:
            resolve_model_path(m)
        release_memory()  # the conversion's buffers, before the workers start
    t0 = time.time()
    # each model's chunks are jobs of their own (one model per process); records are read back in chunk order,
    # every model's records of a chunk together, as if one job had built them
    chunk_of = {it.item_id: ci for ci, c in enumerate(chunks) for it in c}
    records, reused, n_jobs = [], 0, 0
    for k, fam in enumerate(labels):
        if k == 0 or cfg.family_workers is None or engine.executor.kind != "local":
            eng = engine
        else:
            eng = engine_config(engine.executor, cfg.family_workers)
        mine = [c for c in chunks if k == 0 or family_ids is None or any(it.item_id in family_ids for it in c)]
        recs, r = run_chunks(mine, parts, chash, partial(build, k), desc=f"real-LM corpus chunks ({fam})",
                             progress=progress, engine=eng, gpus=chunk_gpus(eng, cfg.device),
                             part_names=[f"chunk-{chunk_of[c[0].item_id]:04d}-m{k}" for c in mine])
        records += recs
        reused += r
        n_jobs += len(mine)
        if k + 1 < len(labels):  # this process's model (chunks run here with one worker) is not the next one's
            _LOADED.clear()
            release_memory()
    records.sort(key=lambda rec: chunk_of[rec["base_item"]])  # stable: model order within a chunk
    gen_seconds = time.time() - t0
    pairs = build_pairs(records, labels, cfg.conditions)
    from sift.corpus.audit import prompt_states_for

    # the prompt-only control needs the models: those given, else when this job built a chunk (as before jobs:
    # a fully reused corpus skips it); one model in memory at a time, loaded here if the chunks ran elsewhere
    loaded: Mapping[str, LMSource] = dict(sources or {})
    if reused < n_jobs:
        loaded = _OneAtATime(cfg, chash, loaded)
    states, why = prompt_states_for(loaded, records)  # one pass over the prompts
    manifest = build_manifest(records, pairs, cfg=asdict(cfg), config_hash=chash,
                              seconds=round(time.time() - t0, 1), chunks_reused=reused, prompt_states=states,
                              prompt_states_reason=why)
    manifest["source"] = "real_lm"
    tokens = sum(len(r["generated_ids"]) for r in records if r["condition"] != "causal_truncation")
    manifest["throughput"] = {  # free generation + verification re-decodes of the chunks built by this run
        "backend": cfg.backend, "device": cfg.device, "dtype": resolve_dtype(cfg.dtype, cfg.device),
        "generated_tokens": tokens, "traces": len(records),
        "seconds": round(gen_seconds, 1), "chunks_built": n_jobs - reused,
        "conversion_seconds": round(t0 - t_conv, 1),  # GGUF files de-quantised by this run (0 when cached)
        "tokens_per_s": round(tokens / gen_seconds, 2) if reused == 0 and gen_seconds > 0 else None,
        "traces_per_s": round(len(records) / gen_seconds, 3) if reused == 0 and gen_seconds > 0 else None}
    manifest["models"] = dict(zip(labels, cfg.models))  # where each model was loaded from (stages reload them)
    manifest["model_names"] = {fam: model_name(m) for fam, m in zip(labels, cfg.models)}
    manifest["labels"] = {"policy": {"label_forced": cfg.label_forced,
                                     "rationalised_is_unfaithful": cfg.rationalised_is_unfaithful,
                                     "interventions": list(cfg.interventions)},
                          "rules": RULES, "by_model": label_summary(records)}
    manifest["intervention_agreement"] = agreement_by_model_and_domain(records)
    manifest["items"] = {"sources": [asdict(s) for s in cfg.item_specs()], "n": len(items),
                         "by_domain": dict(Counter(it.domain for it in items)),
                         "with_translations": sum(bool(it.translations) for it in items),
                         "gold_check": gold_report}  # sift.lm.gold_check: golds recomputed, corrected, dropped
    coverage = axis_coverage(items, cfg)
    for c, cov in coverage.items():
        manifest["axes"][c].update(items_not_applicable=cov["not_applicable"], not_applicable_reason=cov["reason"])
    fams = labels if cfg.family_conditions == "all" else labels[:1]
    for c, info in altering_eligibility(records, fams).items():
        if c in manifest["axes"] and c in cfg.conditions:
            manifest["axes"][c]["eligible_bases"] = info["eligible_bases"]
            manifest["axes"][c]["applies_to"] = info["why_not"]
    manifest["not_applicable"] = [c for c, cov in coverage.items() if cov["not_applicable"] == cov["items"]]
    for c in manifest["not_applicable"]:
        manifest["axes"][c]["not_applicable"] = True
    write_corpus(out_dir, records, pairs, manifest)
    from sift.corpus.label_audit import write_label_audit

    write_label_audit(out_dir / "label_audit.html", records, manifest)
    return manifest


@register_source
class HFCorpus:
    """The ``hf`` corpus source: one or two Hugging Face causal LMs (:class:`HFCorpusConfig`)."""

    name = "hf"

    def build(self, cfg: HFCorpusConfig, out_dir: str | Path, *, progress: bool = True,
              engine: DictConfig | None = None) -> dict[str, Any]:
        return build_hf_corpus(cfg, out_dir, progress=progress, engine=engine)

    def families(self, cfg: HFCorpusConfig) -> list[str]:
        return cfg.labels()

    def models(self, cfg: HFCorpusConfig) -> dict[str, str]:
        """family label → model; a GGUF file maps to its converted safetensors folder (converted once)."""
        from sift.lm.loading import resolve_model_path

        return {fam: resolve_model_path(m) for fam, m in zip(cfg.labels(), cfg.models)}
