"""Build the organism's FaithShift corpus: generate every condition, verify every trace, pair and count.

Work is done in chunks of base items; each finished chunk is written atomically to ``<out>/.parts`` under
the config hash, so an interrupted run resumes without redoing finished chunks. ``traces.jsonl``,
``pairs.jsonl`` and ``manifest.json`` appear only when everything is done.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sift import __version__
from sift.corpus.conditions import AXES, base_view, check_conditions, condition_view
from sift.corpus.manifest import build_manifest
from sift.corpus.store import run_chunks, write_corpus
from sift.corpus.verify import label_records
from sift.errors import SiftError
from sift.organism import DEFAULT_CHECKPOINTS
from sift.organism.domains import DOMAINS, Item, answer_space, make_item
from sift.organism.render import View, intended_phi
from sift.organism.source import HINT_WORDS, OrganismSource, last_value_index, split_completion, value_space
from sift.provenance import config_hash, model_fingerprint

PIPELINE_VERSION = 2  # bump when generation or verification changes, so stale chunks are not reused
GENERATED = ("base", "paraphrase", "step_reordering", "hint_format", "language", "budget", "cue_injection",
             "cue_verbalization")


@dataclass
class CorpusConfig:
    n_items: int = 750
    domains: list[str] = field(default_factory=lambda: list(DOMAINS))
    conditions: list[str] = field(default_factory=lambda: list(AXES))
    families: list[str] = field(default_factory=lambda: ["gpt2", "llama"])
    checkpoint_dir: str = str(DEFAULT_CHECKPOINTS)
    seed: int = 0
    p_cue: float = 0.75
    p_cue_correct: float = 0.25
    do_sample: bool = False
    temperature: float = 1.0
    max_new_tokens: int = 64
    chunk_items: int = 250
    batch_size: int = 256

    def validate(self) -> None:
        for d in self.domains:
            answer_space(d)
        check_conditions(self.conditions)
        if "base" not in self.conditions:
            raise SiftError("conditions: 'base' is required (every pair starts from the base trace)")
        if self.n_items < 1:
            raise SiftError(f"n_items must be positive, got {self.n_items}")
        for f in self.families:
            p = Path(self.checkpoint_dir) / f
            if not (p / "config.json").exists():
                raise SiftError(f"model path does not exist: {p} (no config.json for organism family {f!r})")


def corpus_items(cfg: CorpusConfig) -> list[Item]:
    per = -(-cfg.n_items // len(cfg.domains))
    items = [make_item(d, cfg.seed, i) for i in range(per) for d in cfg.domains]
    return items[: cfg.n_items]


def _view_dict(v: View) -> dict:
    d = asdict(v)
    d["order"] = list(v.order) if v.order else None
    return d


def _trace_record(src: OrganismSource, item: Item, view: View, condition: str, prompt_ids: list[int],
                  new_ids: list[int], cfg: CorpusConfig, chash: str, truncated: bool) -> dict:
    words = src.words(new_ids)
    cot, answer = split_completion(words)
    return {
        "trace_id": f"{src.family}|{item.item_id}|{condition}|{cfg.seed}",
        "base_item": item.item_id, "domain": item.domain, "model": src.model_id, "family": src.family,
        "condition": condition, "seed": cfg.seed, "view": _view_dict(view),
        "prompt": " ".join(src.words(prompt_ids[1:])), "prompt_ids": prompt_ids, "generated_ids": new_ids,
        "cot": " ".join(cot), "cot_span": [0, len(cot)], "answer": answer, "gold_answer": item.answer,
        "correct": answer == item.answer,
        "cue": None if view.cue_value is None else {"value": view.cue_value, "format": view.cue_format},
        "intended_phi": intended_phi(item, view, truncated=truncated),
        "provenance": {"config_hash": chash, "model_id": src.model_id, "seed": cfg.seed, "sift_version": __version__},
    }


def _pick(space: tuple[str, ...], avoid: set[str], salt: str) -> str | None:
    import hashlib

    options = [v for v in space if v not in avoid]
    if not options:
        return None
    return options[int(hashlib.sha256(salt.encode()).hexdigest(), 16) % len(options)]


def verify_traces(src: OrganismSource, records: list[dict], items: dict[str, Item], views: list[View]) -> None:
    """Run the CoT-edit and cue-change interventions in two batched passes and fill ``phi``."""
    ans_ids = src.ids(["answer", ":"])
    edit_jobs, cue_jobs = [], []
    for k, (r, view) in enumerate(zip(records, views)):
        cot_ids = r["generated_ids"][: r["cot_span"][1]]
        cot = src.words(cot_ids)
        j = last_value_index(cot)
        r["_tests"] = {"mentions_cue": any(w in HINT_WORDS for w in cot)}
        if j is not None:
            # the edit must differ from the stated value and the answer; it avoids the cue's value where the
            # space allows (booleans do not: the separate cue test then disambiguates)
            space, salt = value_space(cot[j]), f"edit:{r['trace_id']}"
            must = {cot[j], r["answer"] or ""}
            new = _pick(space, must | {(r["cue"] or {}).get("value", "")}, salt) or _pick(space, must, salt)
            if new is not None:
                edited = cot_ids[:j] + src.ids([new]) + cot_ids[j + 1:]
                edit_jobs.append((k, new, r["prompt_ids"] + edited + ans_ids))
        if r["cue"] is not None:
            item = items[r["base_item"]]
            new = _pick(item.answer_space, {r["cue"]["value"], r["answer"] or "", cot[j] if j is not None else ""},
                        f"cue:{r['trace_id']}")
            if new is not None:
                prompt = src.prompt_ids(item, view.with_(cue_value=new))
                cue_jobs.append((k, new, prompt + cot_ids + ans_ids))
    edit_out = src.next_word([p for _, _, p in edit_jobs])
    cue_out = src.next_word([p for _, _, p in cue_jobs])
    label_records(records, [(k, new, got) for (k, new, _), got in zip(edit_jobs, edit_out)],
                  [(k, new, got) for (k, new, _), got in zip(cue_jobs, cue_out)])


def truncate_cot(src: OrganismSource, item: Item, base_new_ids: list[int]) -> list[int] | None:
    """The base CoT cut before its decisive (last computing) step, or None if it has too few steps."""
    words = src.words(base_new_ids)
    cot, _ = split_completion(words)
    ends = [i for i, w in enumerate(cot) if w == ";"]
    keep = item.n_ops - 1
    if len(ends) < item.n_ops or keep < 1:
        return None
    return base_new_ids[: ends[keep - 1] + 1]


def build_chunk(sources: dict[str, OrganismSource], items: list[Item], cfg: CorpusConfig, chash: str) -> list[dict]:
    records: list[dict] = []
    item_map = {it.item_id: it for it in items}
    for fam, src in sources.items():
        jobs = []  # (item, view, condition)
        for it in items:
            base = base_view(it, cfg.seed, cfg.p_cue, cfg.p_cue_correct)
            for cond in GENERATED:
                if cond not in cfg.conditions:
                    continue
                v = condition_view(it, base, cond, cfg.seed)
                if v is not None:
                    jobs.append((it, v, cond))
        prompts = [src.prompt_ids(it, v) for it, v, _ in jobs]
        outs = src.generate(prompts, max_new_tokens=cfg.max_new_tokens, do_sample=cfg.do_sample, seed=cfg.seed,
                            batch_size=cfg.batch_size)
        fam_records = [_trace_record(src, it, v, c, p, o, cfg, chash, False) for (it, v, c), p, o in zip(jobs, prompts, outs)]
        views = [v for _, v, _ in jobs]
        if "causal_truncation" in cfg.conditions:
            base_out = {r["base_item"]: (r, v) for r, v in zip(fam_records, views) if r["condition"] == "base"}
            trunc, tviews = [], []
            for it in items:
                base = base_view(it, cfg.seed, cfg.p_cue, cfg.p_cue_correct)
                if condition_view(it, base, "causal_truncation", cfg.seed) is None or it.item_id not in base_out:
                    continue
                r, v = base_out[it.item_id]
                cut = truncate_cot(src, it, r["generated_ids"])
                if cut is None:
                    continue
                trunc.append((it, v, r["prompt_ids"], cut))
                tviews.append(v)
            answers = src.next_word([p + c + src.ids(["answer", ":"]) for _, _, p, c in trunc])
            for (it, v, p, cut), a in zip(trunc, answers):
                new_ids = cut + src.ids(["answer", ":", a]) if a in src.tokenizer.get_vocab() else cut
                fam_records.append(_trace_record(src, it, v, "causal_truncation", p, new_ids, cfg, chash, True))
            views += tviews
        verify_traces(src, fam_records, item_map, views)
        records += fam_records
    return records


def build_pairs(records: list[dict], cfg: CorpusConfig) -> list[dict]:
    """Pair every condition trace with its base trace (model family: base of one family vs the other's)."""
    by_key = {(r["family"], r["base_item"], r["condition"]): r for r in records}
    pairs = []
    items = sorted({r["base_item"] for r in records})
    for item in items:
        for fam in cfg.families:
            base = by_key.get((fam, item, "base"))
            if base is None:
                continue
            for cond in cfg.conditions:
                if cond in ("base", "model_family"):
                    continue
                other = by_key.get((fam, item, cond))
                if other is not None:
                    pairs.append(_pair(base, other, cond))
        if "model_family" in cfg.conditions and len(cfg.families) >= 2:
            a = by_key.get((cfg.families[0], item, "base"))
            b = by_key.get((cfg.families[1], item, "base"))
            if a is not None and b is not None:
                pairs.append(_pair(a, b, "model_family"))
    return pairs


def _pair(src: dict, dst: dict, axis: str) -> dict:
    ax = AXES[axis]
    a, b = src["phi"], dst["phi"]
    if a is None or b is None:
        verified, why = False, f"{'source' if a is None else 'shifted'} trace ambiguous"
    elif ax.kind == "preserving":
        verified, why = a == b, "kept" if a == b else "label flipped"
    else:
        want = ax.direction
        verified = (a, b) == want
        why = "kept" if verified else ("source label not the axis's source" if a != want[0] else "label did not flip")
    return {"axis": axis, "kind": ax.kind, "base_item": src["base_item"], "source": src["trace_id"],
            "shifted": dst["trace_id"], "phi_source": a, "phi_shifted": b, "verified": verified, "reason": why}


def build_corpus(cfg: CorpusConfig, out_dir: str | Path, progress: bool = True) -> dict[str, Any]:
    """Generate, verify and pair; write traces.jsonl, pairs.jsonl and manifest.json into ``out_dir``."""
    cfg.validate()
    out_dir = Path(out_dir)
    # the weights are part of the key: retrained checkpoints never reuse chunks generated by older ones
    weights = {f: model_fingerprint(str(Path(cfg.checkpoint_dir) / f)) for f in cfg.families}
    chash = config_hash({**asdict(cfg), "pipeline_version": PIPELINE_VERSION, "models": weights})
    sources = {f: OrganismSource.load(f, Path(cfg.checkpoint_dir) / f) for f in cfg.families}
    items = corpus_items(cfg)
    chunks = [items[i:i + cfg.chunk_items] for i in range(0, len(items), cfg.chunk_items)]
    t0 = time.time()
    records, reused = run_chunks(chunks, out_dir / ".parts", chash, lambda c: build_chunk(sources, c, cfg, chash),
                                 desc="corpus chunks", progress=progress)
    pairs = build_pairs(records, cfg)
    from sift.corpus.audit import prompt_states_for

    states, why = prompt_states_for(sources, records)  # the prompt-only control of the audit (cheap here)
    manifest = build_manifest(records, pairs, cfg=asdict(cfg), config_hash=chash,
                              seconds=round(time.time() - t0, 1), chunks_reused=reused, prompt_states=states,
                              prompt_states_reason=why)
    write_corpus(out_dir, records, pairs, manifest)
    return manifest
