"""The FaithShift corpus on real Hugging Face causal LMs (docs/design.md §2–§4), same files as the organism's.

Items come from reasoning-gym or from local GSM8K / MATH / CommonsenseQA / BBH files
(:mod:`sift.lm.items`); one or two models load through :func:`sift.lm.loading.load_causal_lm` (the second
gives the model-family axis). Per model and chunk of base items:

1. **generate** base, paraphrase (another question wrapper), hint_format (the base cue in another format),
   budget (terse ↔ verbose) — batched, left-padded, KV cache, greedy or seeded sampling;
2. **verify** every trace, as in the organism, by teacher-forced re-decoding of the answer only:
   *CoT edit* — the last value the CoT states (a number; an option letter or truth value for choice /
   boolean items) is replaced, the CoT kept token for token up to that value, ``Answer:`` forced, and a few
   answer tokens decoded greedily and parsed; *cue change* — the cue's value in the prompt is replaced, the
   generated CoT ids kept exactly, the answer re-decoded the same way; *mentions_cue* — a regex for the cue's
   words (hint, professor, suggested answer, ...) on the CoT; then :func:`sift.corpus.verify.phi_from_tests`;
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
import random
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from tqdm import tqdm

from sift import __version__
from sift.corpus.axes import AXES, generated_axes
from sift.corpus.config import HFCorpusConfig
from sift.corpus.manifest import build_manifest
from sift.corpus.pairs import build_pairs
from sift.corpus.sources import register_source
from sift.corpus.store import engine_config, run_chunks, write_corpus
from sift.corpus.verify import label_records
from sift.errors import SiftError
from sift.lm.items import LMItem, from_reasoning_gym, load_items
from sift.lm.parsing import answer_line_start, last_value_span, normalize_number, parse_answer
from sift.lm.prompts import ANSWER_PREFIX, BUDGETS, CUE_FORMATS, DECISIVE_FORMAT, TEMPLATES, LMView, mentions_cue
from sift.lm.prompts import prompt_ids as render_prompt_ids
from sift.provenance import config_hash, model_fingerprint

# ------------------------------------------------------------------------------------------------- model side

class LMSource:
    """A loaded HF causal LM with the text/id interface the corpus needs."""

    def __init__(self, family: str, model, tokenizer, model_id: str, *, batch_size: int = 8,
                 system_prompt: str | None = None):
        self.family, self.model, self.tokenizer, self.model_id = family, model, tokenizer, model_id
        self.batch_size, self.system_prompt = batch_size, system_prompt
        if tokenizer.pad_token_id is None:
            raise SiftError(f"model {model_id}: the tokenizer has neither a pad nor an eos token")

    @classmethod
    def load(cls, family: str, name_or_path: str, *, device: str = "cpu", dtype: str | None = None,
             batch_size: int = 8, system_prompt: str | None = None) -> LMSource:
        from sift.lm.loading import load_causal_lm

        model, tok = load_causal_lm(name_or_path, device=device, dtype=dtype)
        return cls(family, model, tok, name_or_path, batch_size=batch_size, system_prompt=system_prompt)

    def prompt_ids(self, item: LMItem, view: LMView) -> list[int]:
        return render_prompt_ids(self.tokenizer, item, view, self.system_prompt)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def answer_prefix(self, cot_text: str) -> list[int]:
        """Ids of the forced answer line start: ``Answer:`` on a new line after the CoT."""
        sep = "" if not cot_text or cot_text.endswith("\n") else "\n"
        return self.encode(sep + ANSWER_PREFIX)

    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                 desc: str | None = None) -> list[list[int]]:
        """New ids per prompt; prompts are batched by length (the order of the results is the input's)."""
        from sift.lm.generation import generate_ids

        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[list[int] | None] = [None] * len(prompts)
        tok = self.tokenizer
        starts = range(0, len(order), self.batch_size)
        for s in tqdm(starts, desc=desc, disable=desc is None or len(order) <= self.batch_size, leave=False):
            idx = order[s:s + self.batch_size]
            gens = generate_ids(self.model, [prompts[i] for i in idx], pad_id=tok.pad_token_id,
                                eos_id=tok.eos_token_id, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                temperature=temperature, top_p=top_p, seed=seed + s, batch_size=self.batch_size)
            for i, g in zip(idx, gens):
                out[i] = g.new_ids
        return out  # type: ignore[return-value]

    def redecode(self, prefixes: Sequence[Sequence[int]], kinds: Sequence[str], n_tokens: int,
                 choices: Sequence[Any] | None = None) -> list[tuple[str | None, list[int]]]:
        """Greedy answer after each forced-answer prefix: (parsed answer of its first line, the ids)."""
        outs = self.generate(prefixes, max_new_tokens=n_tokens) if prefixes else []
        res = []
        for k, ids in enumerate(outs):
            text = self.decode(ids)
            first = re.match(r"\s*[^\n]*", text).group(0)
            ch = choices[k] if choices else None
            res.append((parse_answer(ANSWER_PREFIX + first, kinds[k], choices=ch), ids))
        return res


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
        fmt = rng.choice(CUE_FORMATS)
        correct = rng.random() < cfg.cue.p_cue_correct
        value = item.answer if correct else cue_value(item, set(), f"cue:{cfg.seed}:{item.item_id}")
        if value is not None:
            view = view.with_(cue_value=value, cue_format=fmt)
    return view


def phase1_conditions() -> list[str]:
    """The base and preserving axes a real LM generates: those that render an LM view."""
    return [c for c in generated_axes(("base", "preserving")) if AXES[c].applies_to_lm()]


def not_applicable() -> list[str]:
    """Generated preserving axes with no realisation on free-form items (listed in the manifest, 0 pairs)."""
    return [c for c in generated_axes(("preserving",)) if not AXES[c].applies_to_lm()]


def phase1_view(item: LMItem, base: LMView, condition: str, seed: int) -> LMView | None:
    """The view of a base or preserving condition (:meth:`sift.corpus.axes.Axis.lm_view`)."""
    rng = random.Random(f"real-cond:{seed}:{item.item_id}:{condition}")
    return AXES[condition].lm_view(item, base, rng)


def truncation_cut(src: LMSource, record: dict) -> list[int] | None:
    """The base CoT's ids cut before its last non-empty reasoning line (None with fewer than two lines)."""
    cot_ids = record["generated_ids"][: record["cot_span"][1]]
    cot = src.decode(cot_ids)
    starts = [m.start() for m in re.finditer(r"^[ \t]*\S", cot, re.MULTILINE)]
    if len(starts) < 2:
        return None
    j = token_index(src, cot_ids, starts[-1], cot)
    return cot_ids[:j] if j > 0 else None


# ------------------------------------------------------------------------------------------------- records

def trace_record(src: LMSource, item: LMItem, view: LMView, condition: str, prompt: list[int], new_ids: list[int],
                 cfg: HFCorpusConfig, chash: str) -> dict:
    """A trace in the organism's record schema (sift.corpus.sources.organism._trace_record)."""
    text = src.decode(new_ids)
    answer = parse_answer(text, item.answer_kind, choices=item.choices)
    start = answer_line_start(text)
    cot_end = len(new_ids) if start is None else token_index(src, new_ids, start, text)
    ax = AXES[condition]
    return {
        "trace_id": f"{src.family}|{item.item_id}|{condition}|{cfg.seed}",
        "base_item": item.item_id, "domain": item.domain, "model": src.model_id, "family": src.family,
        "condition": condition, "seed": cfg.seed, "view": view.to_dict(),
        "prompt": src.decode(prompt), "prompt_ids": list(prompt), "generated_ids": list(new_ids),
        "cot": src.decode(new_ids[:cot_end]), "cot_span": [0, cot_end], "answer": answer,
        "gold_answer": item.answer, "correct": answer == item.answer,
        "cue": None if view.cue_value is None else {"value": view.cue_value, "format": view.cue_format},
        "intended_phi": ax.direction[1] if ax.kind == "altering" else None,
        "provenance": {"config_hash": chash, "model_id": src.model_id, "seed": cfg.seed, "sift_version": __version__},
    }


def verify_records(src: LMSource, records: list[dict], views: list[LMView], items: dict[str, LMItem],
                   cfg: HFCorpusConfig) -> None:
    """CoT-edit and cue-change interventions (two batched greedy re-decodes); fills ``phi`` and ``verification``."""
    edit_jobs, cue_jobs = [], []  # (record index, new value, value kind, prefix ids)
    for k, (r, view) in enumerate(zip(records, views)):
        item = items[r["base_item"]]
        cot_ids = r["generated_ids"][: r["cot_span"][1]]
        cot = src.decode(cot_ids)
        r["_tests"] = {"mentions_cue": mentions_cue(cot)}
        cue = (r["cue"] or {}).get("value")
        span = last_value_span(cot, item.answer_kind, _labels(item) or None)
        if span is not None:
            s, e, val, vkind = span
            new = alternative(val, vkind, {r["answer"], cue}, f"edit:{r['trace_id']}", _labels(item) or "ABCDE")
            if new is not None:
                j = token_index(src, cot_ids, s, cot)
                head = src.decode(cot_ids[:j])
                edited = cot[:s] + _restyle(cot[s:e], new, vkind) + cot[e:]
                ids = cot_ids[:j] + src.encode(edited[len(head):])
                edit_jobs.append((k, new, vkind, r["prompt_ids"] + ids + src.answer_prefix(edited)))
                r["_tests"]["edit_span"] = [s, e]
        if cue is not None:
            new = alternative(cue, item.answer_kind, {r["answer"], span[2] if span else None},
                              f"cue:{r['trace_id']}", _labels(item))
            if new is not None:
                prompt = src.prompt_ids(item, view.with_(cue_value=new))
                cue_jobs.append((k, new, item.answer_kind, prompt + cot_ids + src.answer_prefix(cot)))
    jobs = edit_jobs + cue_jobs
    got = src.redecode([p for *_, p in jobs], [kd for _, _, kd, _ in jobs], cfg.answer_tokens,
                       [items[records[k]["base_item"]].choices for k, *_ in jobs])
    label_records(records, [(k, new, ans) for (k, new, _, _), (ans, _) in zip(edit_jobs, got[:len(edit_jobs)])],
                  [(k, new, ans) for (k, new, _, _), (ans, _) in zip(cue_jobs, got[len(edit_jobs):])])


# ------------------------------------------------------------------------------------------------- chunks

def _generate_records(src: LMSource, jobs: list[tuple[LMItem, LMView, str]], cfg: HFCorpusConfig, chash: str,
                      desc: str) -> list[dict]:
    prompts = [src.prompt_ids(it, v) for it, v, _ in jobs]
    outs = src.generate(prompts, max_new_tokens=cfg.max_new_tokens, do_sample=cfg.do_sample,
                        temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed, desc=desc)
    return [trace_record(src, it, v, c, p, o, cfg, chash) for (it, v, c), p, o in zip(jobs, prompts, outs)]


def build_chunk_for(src: LMSource, items: list[LMItem], cfg: HFCorpusConfig, chash: str,
                    conditions: Sequence[str]) -> list[dict]:
    """All traces of one model on one chunk of items, verified."""
    item_map = {it.item_id: it for it in items}
    bases = {it.item_id: base_view(it, cfg) for it in items}
    jobs = []
    for it in items:
        for cond in phase1_conditions():
            if cond in conditions:
                v = phase1_view(it, bases[it.item_id], cond, cfg.seed)
                if v is not None:
                    jobs.append((it, v, cond))
    records = _generate_records(src, jobs, cfg, chash, f"{src.family}: generate")
    views = [v for _, v, _ in jobs]
    verify_records(src, records, views, item_map, cfg)

    # altering conditions on verified bases
    base_rec = {r["base_item"]: r for r in records if r["condition"] == "base"}
    jobs2 = []
    trunc = []  # (item, view, prompt ids, cut ids)
    for it in items:
        r = base_rec.get(it.item_id)
        if r is None or r["phi"] is None:
            continue
        base = bases[it.item_id]
        if "cue_injection" in conditions and r["phi"] == 1:
            value = cue_value(it, {r["answer"], base.cue_value}, f"inject:{cfg.seed}:{it.item_id}")
            if value is not None:
                jobs2.append((it, base.with_(cue_value=value, cue_format=DECISIVE_FORMAT), "cue_injection"))
        if "cue_verbalization" in conditions and r["phi"] == 0 and base.cue_value is not None:
            jobs2.append((it, base.with_(explain=True), "cue_verbalization"))
        if "causal_truncation" in conditions and r["phi"] == 1:
            cut = truncation_cut(src, r)
            if cut is not None:
                trunc.append((it, base, r["prompt_ids"], cut))
    recs2 = _generate_records(src, jobs2, cfg, chash, f"{src.family}: altering") if jobs2 else []
    views2 = [v for _, v, _ in jobs2]
    if trunc:
        heads = [cut + src.answer_prefix(src.decode(cut)) for _, _, _, cut in trunc]
        got = src.redecode([p + h for (_, _, p, _), h in zip(trunc, heads)], [it.answer_kind for it, *_ in trunc],
                           cfg.answer_tokens, [it.choices for it, *_ in trunc])
        for (it, v, p, _), h, (_, ids) in zip(trunc, heads, got):
            recs2.append(trace_record(src, it, v, "causal_truncation", p, h + ids, cfg, chash))
            views2.append(v)
    if recs2:
        verify_records(src, recs2, views2, item_map, cfg)
    return records + recs2


def load_corpus_items(cfg: HFCorpusConfig) -> list[LMItem]:
    if cfg.items == "reasoning_gym":
        items = from_reasoning_gym(cfg.task, cfg.n_items, cfg.seed)
    else:
        items = load_items(cfg.path, cfg.items, cfg.n_items)
    ids = [it.item_id for it in items]
    if len(set(ids)) != len(ids):
        raise SiftError("item ids are not unique; give each record a distinct id")
    return items


#: models loaded in this process, by family label: (corpus config hash, source); a chunk worker keeps its models
#: for its next chunks, and :func:`build_hf_corpus` drops them when it returns
_LOADED: dict[str, tuple[str, LMSource]] = {}


def lm_source(cfg: HFCorpusConfig, chash: str, k: int) -> LMSource:
    """Model ``k`` of ``cfg``, loaded once per process and corpus hash."""
    fam = cfg.labels()[k]
    if _LOADED.get(fam, ("",))[0] != chash:
        _LOADED.pop(fam, None)
        _LOADED[fam] = (chash, LMSource.load(fam, cfg.models[k], device=cfg.device, dtype=cfg.dtype,
                                             batch_size=cfg.batch_size, system_prompt=cfg.system_prompt))
    return _LOADED[fam][1]


def chunk_records(cfg: HFCorpusConfig, chash: str, chunk: list[LMItem],
                  sources: Mapping[str, LMSource] | None = None) -> list[dict]:
    """Every model's verified records of one chunk (a corpus job: picklable through ``functools.partial``);
    ``sources`` (family → model in memory) skip loading."""
    labels = cfg.labels()
    recs: list[dict] = []
    for k in range(len(cfg.models)):
        conds = cfg.conditions if k == 0 or cfg.family_conditions == "all" else ["base"]
        src = sources[labels[k]] if sources and labels[k] in sources else lm_source(cfg, chash, k)
        recs += build_chunk_for(src, chunk, cfg, chash, conds)
    return recs


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
        _LOADED.clear()  # free the models this process loaded (a worker's stay until it exits)


def _build_hf_corpus(cfg: HFCorpusConfig, out_dir: Path, progress: bool, sources: dict[str, LMSource] | None,
                       engine: DictConfig | None) -> dict[str, Any]:
    cfg.validate()
    labels = cfg.labels()
    # model fingerprints (weights of a folder or file; the name for a cached hub model) are part of the key
    chash = config_hash({**asdict(cfg), "models": [model_fingerprint(m) for m in cfg.models]})
    parts = out_dir / ".parts"
    parts.mkdir(parents=True, exist_ok=True)
    items = load_corpus_items(cfg)
    chunks = [items[i:i + cfg.chunk_items] for i in range(0, len(items), cfg.chunk_items)]
    if sources:
        if engine is not None and (engine.executor.kind != "local" or int(engine.workers) > 1):
            raise SiftError("build_hf_corpus: models passed in memory (sources) run in this process; "
                            "use executor=local workers=1, or pass no sources")
        build = partial(chunk_records, cfg, chash, sources=sources)
    else:
        build = partial(chunk_records, cfg, chash)
    t0 = time.time()
    engine = engine if engine is not None else engine_config()
    records, reused = run_chunks(chunks, parts, chash, build, desc="real-LM corpus chunks", progress=progress,
                                 engine=engine, gpus=chunk_gpus(engine, cfg.device))
    pairs = build_pairs(records, labels, cfg.conditions)
    from sift.corpus.audit import prompt_states_for

    # the prompt-only control needs the models: those given, else when this job built a chunk (as before jobs:
    # a fully reused corpus skips it); loaded here once if the chunks ran in other processes
    loaded: dict[str, LMSource] = dict(sources or {})
    if reused < len(chunks):
        loaded.update({labels[k]: lm_source(cfg, chash, k) for k in range(len(cfg.models))
                       if labels[k] not in loaded})
    states, why = prompt_states_for(loaded, records)  # one pass over the prompts
    manifest = build_manifest(records, pairs, cfg=asdict(cfg), config_hash=chash,
                              seconds=round(time.time() - t0, 1), chunks_reused=reused, prompt_states=states,
                              prompt_states_reason=why)
    manifest["source"] = "real_lm"
    manifest["models"] = dict(zip(labels, cfg.models))
    manifest["items"] = {"source": cfg.items, "task": cfg.task if cfg.items == "reasoning_gym" else None,
                         "path": cfg.path, "n": len(items)}
    manifest["not_applicable"] = [c for c in not_applicable() if c in cfg.conditions]
    for c in manifest["not_applicable"]:
        manifest["axes"][c]["not_applicable"] = True
    write_corpus(out_dir, records, pairs, manifest)
    return manifest


@register_source
class HFCorpus:
    """The ``hf`` corpus source: one or two Hugging Face causal LMs (:class:`HFCorpusConfig`)."""

    name = "hf"

    def build(self, cfg: HFCorpusConfig, out_dir: str | Path, *, progress: bool = True,
              engine: DictConfig | None = None) -> dict[str, Any]:
        return build_hf_corpus(cfg, out_dir, progress=progress, engine=engine)
