"""Build the organism's FaithShift corpus: generate every condition, verify every trace, pair and count.

Work is done in chunks of base items; each finished chunk is written atomically to ``<out>/.parts`` under
the config hash, so an interrupted run resumes without redoing finished chunks. ``traces.jsonl``,
``pairs.jsonl`` and ``manifest.json`` appear only when everything is done.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sift import __version__
from sift.corpus.axes import generated_axes
from sift.corpus.chunk import TRUNCATION, build_chunk
from sift.corpus.conditions import base_view, condition_view
from sift.corpus.config import OrganismCorpusConfig
from sift.corpus.manifest import build_manifest
from sift.corpus.pairs import build_pairs
from sift.corpus.sources import register_source
from sift.corpus.store import run_chunks, write_corpus
from sift.corpus.verify import Probe, Trace, phi_from_tests, verify
from sift.errors import SiftError
from sift.organism.domains import Item, make_item
from sift.organism.latent import latent_value, record_latent
from sift.organism.render import OPENERS, View, cue_word_span, intended_phi, opener_of
from sift.organism.source import HINT_WORDS, OrganismSource, last_value_index, split_completion, value_space
from sift.provenance import config_hash, model_fingerprint

PIPELINE_VERSION = 6  # bump when generation or verification changes, so stale chunks are not reused
#: every base item is generated under both mechanism latents (twins): 1 (the CoT is read), then 0
MECHANISMS = (1, 0)


def corpus_items(cfg: OrganismCorpusConfig) -> list[Item]:
    per = -(-cfg.n_items // len(cfg.domains))
    items = [make_item(d, cfg.seed, i) for i in range(per) for d in cfg.domains]
    return items[: cfg.n_items]


def _view_dict(v: View) -> dict:
    d = asdict(v)
    d["order"] = list(v.order) if v.order else None
    return d


def twin_key(family: str, item_id: str, condition: str, seed: int) -> str:
    """What a trace's twins share: the trace id without its mechanism (``gpt2|arithmetic-0-00001|base|0``)."""
    return f"{family}|{item_id}|{condition}|{seed}"


def trace_id(family: str, item_id: str, condition: str, seed: int, mechanism: int) -> str:
    """``<twin key>|m<mechanism>``: the twins of one prompt differ only in the last field."""
    return f"{twin_key(family, item_id, condition, seed)}|m{mechanism}"


def _trace_record(src: OrganismSource, item: Item, view: View, condition: str, prompt_ids: list[int],
                  new_ids: list[int], cfg: OrganismCorpusConfig, chash: str, truncated: bool,
                  mechanism: int) -> dict:
    words = src.words(new_ids)
    cot, answer = split_completion(words)
    opener = opener_of(cot)
    return {
        "trace_id": trace_id(src.family, item.item_id, condition, cfg.seed, mechanism),
        "twin": twin_key(src.family, item.item_id, condition, cfg.seed),
        "base_item": item.item_id, "domain": item.domain, "model": src.model_id, "family": src.family,
        "condition": condition, "seed": cfg.seed, "view": _view_dict(view),
        "prompt": " ".join(src.words(prompt_ids[1:])), "prompt_ids": prompt_ids, "generated_ids": new_ids,
        "cot": " ".join(cot), "cot_span": [0, len(cot)], "answer": answer, "gold_answer": item.answer,
        "correct": answer == item.answer,
        "cue": None if view.cue_value is None else {"value": view.cue_value, "format": view.cue_format},
        # the cue's tokens in prompt_ids (after <bos>; per-head attention mass on the cue, sift.trajectories)
        "cue_span": None if (span := cue_word_span(item, view)) is None else [span[0] + 1, span[1] + 1],
        "opener": None if opener is None else OPENERS[opener], "sampling_seed": cfg.stream_seed,
        # the mechanism latent the organism ran with (replayed by every later forward pass over the trace) and
        # the label it intends (sift.organism.render.intended_phi)
        "latent": record_latent(mechanism), "mechanism_kind": src.mechanism_kind,
        "intended_phi": intended_phi(view, mechanism, truncated=truncated),
        "provenance": {"config_hash": chash, "model_id": src.model_id, "seed": cfg.seed,
                       "sampling_seed": cfg.stream_seed, "sift_version": __version__},
    }


def _pick(space: tuple[str, ...], avoid: set[str], salt: str) -> str | None:
    import hashlib

    options = [v for v in space if v not in avoid]
    if not options:
        return None
    return options[int(hashlib.sha256(salt.encode()).hexdigest(), 16) % len(options)]


def _salt_key(record: dict) -> str:
    """The key of a trace's edit draw: its twin key, so both twins of a prompt get the same edit (only the latent
    differs between them); the trace id for records without one."""
    return str(record.get("twin") or record["trace_id"])


#: the organism's ``verification`` fields, in the order they are written
_FIELDS = ("mentions_cue", "edit_value", "edit_answer", "edit_follows", "cue_value", "cue_answer", "cue_follows")


class OrganismVerifier:
    """The organism's side of the one verification path (:class:`sift.corpus.verify.SourceVerifier`): a CoT is
    its words; the stated result is the last value word; the answer is the greedy next word after ``answer :``,
    with the trace's latent replayed from the prefix's first CoT position; the label rule is
    :func:`sift.corpus.verify.phi_from_tests` (the edit and cue-change tests only)."""

    def __init__(self, src: OrganismSource):
        self.src = src
        self._answer = src.ids(["answer", ":"])

    def shown(self, item: Item, view: View) -> Item:
        return item

    def read(self, cot_ids: list[int]) -> list[str]:
        return self.src.words(cot_ids)

    def prompt_ids(self, item: Item, view: View) -> list[int]:
        return self.src.prompt_ids(item, view)

    def answer_prefix(self, cot: list[str]) -> list[int]:
        return list(self._answer)

    def mentions_cue(self, cot: list[str]) -> bool:
        return any(w in HINT_WORDS for w in cot)

    def stated_result(self, t: Trace) -> int | None:
        return last_value_index(t.cot)

    def edit_value(self, t: Trace) -> str | None:
        # the edit differs from the stated value and the answer; it avoids the cue's value where the space allows
        # (booleans do not: the separate cue test then disambiguates)
        r, stated = t.record, t.cot[t.site]
        space, salt = value_space(stated), f"edit:{_salt_key(r)}"
        must = {stated, r["answer"] or ""}
        return _pick(space, must | {(r["cue"] or {}).get("value", "")}, salt) or _pick(space, must, salt)

    def edited(self, t: Trace, value: str) -> tuple[list[int], list[str]]:
        j = t.site
        return t.cot_ids[:j] + self.src.ids([value]) + t.cot_ids[j + 1:], t.cot[:j] + [value] + t.cot[j + 1:]

    def cue_change(self, t: Trace, edit_value: str | None) -> str | None:
        r = t.record
        return _pick(t.shown.answer_space, {r["cue"]["value"], r["answer"] or "",
                                            t.cot[t.site] if t.site is not None else ""}, f"cue:{r['trace_id']}")

    def more_tests(self, t: Trace, cue_value: str | None) -> tuple[list[Probe], list]:
        return [], []

    def answers(self, probes: Sequence[Probe], records: Sequence[dict],
                shown: Sequence[Item]) -> list[tuple[str, list[int] | None]]:
        """Batched per test (every edit, then every cue change, in trace order)."""
        out: list[tuple[str, list[int] | None] | None] = [None] * len(probes)
        vocab = self.src.tokenizer.get_vocab()
        for tag in dict.fromkeys(p.tag for p in probes):
            idx = [i for i, p in enumerate(probes) if p.tag == tag]
            words = self.src.next_word([probes[i].prefix for i in idx],
                                       latents=[records[probes[i].k]["latent"]["value"] for i in idx],
                                       starts=[probes[i].start for i in idx])
            for i, w in zip(idx, words):
                out[i] = (w, self.src.ids([w]) if w in vocab else None)
        return out  # type: ignore[return-value]

    def record_answer(self, probe: Probe, answer: str | None, tests: dict) -> None:
        raise SiftError(f"organism verification: no test {probe.tag!r}")

    def rewrite(self, rewrites, records, shown, tests) -> None:
        if rewrites:
            raise SiftError("organism verification: no rewriting tests")

    def label(self, record: dict, tests: dict) -> tuple[int | None, dict]:
        phi, reason = phi_from_tests(record["answer"], tests.get("edit_follows"), tests.get("cue_follows"),
                                     tests["mentions_cue"])
        # each test's fields together: the edit's, then the cue change's (any other field after them)
        return phi, {"reason": reason, **{f: tests[f] for f in _FIELDS if f in tests}, **tests}

    def last_step(self, record: dict, item: Item, cot_ids: list[int]) -> int | None:
        """The start of the CoT's last *computing* step: its steps end at ``;``, the first ``n_ops`` compute
        (a choice item's option checks and pick follow them); None when the CoT has fewer steps."""
        ends = [i for i, w in enumerate(self.src.words(cot_ids)) if w == ";"]
        if item.n_ops < 2 or len(ends) < item.n_ops:
            return None
        return ends[item.n_ops - 2] + 1


def item_stream(cfg: OrganismCorpusConfig, item: Item) -> str:
    """The random stream of an item's draws: shared by all its views and both families."""
    return f"{cfg.stream_seed}:{item.item_id}"


def _generate(src: OrganismSource, jobs: list[tuple[Item, View, str, int]], cfg: OrganismCorpusConfig,
              chash: str) -> list[dict]:
    """Generate ``(item, view, condition, mechanism)`` jobs: the item's random stream drives the draws, the
    mechanism only the latent, so twins make the same draws."""
    prompts = [src.prompt_ids(it, v) for it, v, _, _ in jobs]
    outs = src.generate(prompts, max_new_tokens=cfg.max_new_tokens, do_sample=cfg.do_sample, seed=cfg.stream_seed,
                        batch_size=cfg.batch_size, streams=[item_stream(cfg, it) for it, *_ in jobs],
                        top_p=cfg.top_p, latents=[latent_value(m) for *_, m in jobs])
    return [_trace_record(src, it, v, c, p, o, cfg, chash, False, m)
            for (it, v, c, m), p, o in zip(jobs, prompts, outs)]


class OrganismChunk:
    """The organism's side of the one chunk builder (:class:`sift.corpus.chunk.ChunkSource`) for one family.

    Each prompt is generated twice from the same random stream, once under each mechanism latent
    (:data:`MECHANISMS`): the *twins* write the same ids (the organism is trained to), so on base and preserving
    traces the text is distributed alike under both labels by construction. The altering axes start from a base
    twin's intended label (known as soon as it is generated), and every trace is verified at the end."""

    labels_first = False

    def __init__(self, src: OrganismSource, cfg: OrganismCorpusConfig, chash: str):
        self.src, self.cfg, self.chash = src, cfg, chash
        self.verifier = OrganismVerifier(src)

    def phase1_jobs(self, items: Sequence[Item], conditions: Sequence[str]) -> list[tuple[Item, View, str, int]]:
        jobs = []  # (item, view, condition, mechanism)
        for it in items:
            base = base_view(it, self.cfg.seed, self.cfg.cue)
            for cond in generated_axes(("base", "preserving")):
                v = condition_view(it, base, cond, self.cfg.seed) if cond in conditions else None
                if v is not None:
                    jobs += [(it, v, cond, m) for m in MECHANISMS]
        return jobs

    def view_of(self, job: tuple[Item, View, str, int]) -> View:
        return job[1]

    def generate(self, jobs: Sequence[tuple[Item, View, str, int]], desc: str) -> list[dict]:
        return _generate(self.src, list(jobs), self.cfg, self.chash)

    def bases(self, records: Sequence[dict], views: Sequence[View],
              items: Sequence[Item]) -> list[tuple[dict, Item, View]]:
        out = {(r["base_item"], r["latent"]["mechanism"]): (r, v)
               for r, v in zip(records, views) if r["condition"] == "base"}
        return [(out[(it.item_id, m)][0], it, out[(it.item_id, m)][1]) for it in items for m in MECHANISMS
                if (it.item_id, m) in out]

    def altering_view(self, condition: str, base: dict, item: Item, view: View) -> View | None:
        return condition_view(item, view, condition, self.cfg.seed, base["intended_phi"])

    def altering_job(self, condition: str, base: dict, item: Item, view: View) -> tuple[Item, View, str, int]:
        return item, view, condition, base["latent"]["mechanism"]

    def truncation_record(self, base: dict, item: Item, view: View, new_ids: list[int]) -> dict:
        return _trace_record(self.src, item, view, TRUNCATION, base["prompt_ids"], new_ids, self.cfg, self.chash,
                             True, base["latent"]["mechanism"])


def labels_across_seeds(sources: dict[str, OrganismSource], items: list[Item], cfg: OrganismCorpusConfig,
                        seeds: list[int]) -> dict[str, Any]:
    """Regenerate and verify each base prompt's twins under several sampling seeds: how often one prompt gives
    both labels, and how often its twins write the same ids (the text-blindness the corpus rests on)."""
    from dataclasses import replace

    from sift.corpus.audit import same_ids, twin_pairs

    item_map = {it.item_id: it for it in items}
    bases = [(it, base_view(it, cfg.seed, cfg.cue), "base", m) for it in items for m in MECHANISMS]
    cued = {it.item_id for it, v, _, _ in bases if v.cue_value is not None}
    out: dict[str, Any] = {"seeds": list(seeds), "prompts": len(items), "cued_prompts": len(cued), "families": {}}
    for fam, src in sources.items():
        labels: dict[str, set] = {}
        same, n_twins = 0, 0
        for s in seeds:
            recs = _generate(src, bases, replace(cfg, sampling_seed=s), "audit")
            verify(OrganismVerifier(src), recs, [v for _, v, _, _ in bases], item_map)
            for r in recs:
                if r["phi"] is not None:
                    labels.setdefault(r["base_item"], set()).add(r["phi"])
            for a, b in twin_pairs(recs):
                n_twins += 1
                same += same_ids(a, b)
        both = {k for k, v in labels.items() if len(v) == 2}
        out["families"][fam] = {"share_both": round(len(both) / max(1, len(items)), 4),
                                "share_both_cued": round(len(both & cued) / max(1, len(cued)), 4),
                                "share_phi0": round(sum(0 in v for v in labels.values()) / max(1, len(items)), 4),
                                "twins_identical_ids": round(same / max(1, n_twins), 4)}
    fams = out["families"].values()
    out["share_both"] = round(sum(f["share_both"] for f in fams) / max(1, len(out["families"])), 4)
    return out


#: organism models loaded in this process, by folder: (corpus config hash, source). A chunk worker keeps its
#: models for its next chunks; a new hash (other config or retrained weights) loads them again.
_SOURCES: dict[str, tuple[str, OrganismSource]] = {}


def organism_sources(cfg: OrganismCorpusConfig, chash: str) -> dict[str, OrganismSource]:
    """Family → the organism model of ``cfg.checkpoint_dir``, loaded once per process and corpus hash."""
    out = {}
    for f in cfg.families:
        path = str(cfg.model_dir(f))
        if _SOURCES.get(path, ("",))[0] != chash:
            _SOURCES[path] = (chash, OrganismSource.load(f, Path(path), cfg.mechanism_kind))
        out[f] = _SOURCES[path][1]
    return out


def organism_chunk(cfg: OrganismCorpusConfig, chash: str, items: list[Item]) -> list[dict]:
    """One chunk's verified records, every family in turn (:func:`sift.corpus.chunk.build_chunk` on
    :class:`OrganismChunk`; a corpus job: picklable through ``functools.partial``)."""
    records: list[dict] = []
    for src in organism_sources(cfg, chash).values():
        records += build_chunk(OrganismChunk(src, cfg, chash), items, cfg.conditions)
    return records


def build_corpus(cfg: OrganismCorpusConfig, out_dir: str | Path, progress: bool = True,
                 engine: DictConfig | None = None) -> dict[str, Any]:
    """Generate, verify and pair; write traces.jsonl, pairs.jsonl and manifest.json into ``out_dir``.

    ``engine`` (:func:`sift.corpus.store.engine_config`): where the chunks not yet built run (default: here)."""
    cfg.validate()
    out_dir = Path(out_dir)
    # the weights are part of the key: retrained checkpoints never reuse chunks generated by older ones
    weights = {f: model_fingerprint(str(cfg.model_dir(f))) for f in cfg.families}
    chash = config_hash({**asdict(cfg), "pipeline_version": PIPELINE_VERSION, "models": weights})
    items = corpus_items(cfg)
    chunks = [items[i:i + cfg.chunk_items] for i in range(0, len(items), cfg.chunk_items)]
    t0 = time.time()
    records, reused = run_chunks(chunks, out_dir / ".parts", chash, partial(organism_chunk, cfg, chash),
                                 desc="corpus chunks", progress=progress, engine=engine)
    sources = organism_sources(cfg, chash)  # the audits below run here (the organism is small)
    pairs = build_pairs(records, cfg.families, cfg.conditions)
    from sift.corpus.audit import prompt_states_for

    stochasticity = None
    if cfg.do_sample and cfg.audit_seeds > 1 and "base" in cfg.conditions:
        seeds = [cfg.stream_seed + k for k in range(cfg.audit_seeds)]
        stochasticity = labels_across_seeds(sources, items, cfg, seeds)
    states, why = prompt_states_for(sources, records)  # the prompt-only control of the audit (cheap here)
    manifest = build_manifest(records, pairs, cfg=asdict(cfg), config_hash=chash,
                              seconds=round(time.time() - t0, 1), chunks_reused=reused, prompt_states=states,
                              prompt_states_reason=why)
    manifest["mechanism_kind"] = cfg.mechanism_kind  # where the latent enters (sift.lm.latent.MECHANISM_KINDS)
    if stochasticity is not None:
        manifest["mechanism_across_seeds"] = stochasticity
    write_corpus(out_dir, records, pairs, manifest)
    return manifest


@register_source
class OrganismCorpus:
    """The ``organism`` corpus source: the embedded organism's two families (:class:`OrganismCorpusConfig`)."""

    name = "organism"

    def build(self, cfg: OrganismCorpusConfig, out_dir: str | Path, *, progress: bool = True,
              engine: DictConfig | None = None) -> dict[str, Any]:
        return build_corpus(cfg, out_dir, progress=progress, engine=engine)

    def families(self, cfg: OrganismCorpusConfig) -> list[str]:
        return list(cfg.families)

    def models(self, cfg: OrganismCorpusConfig) -> dict[str, str]:
        return {f: str(cfg.model_dir(f)) for f in cfg.families}
