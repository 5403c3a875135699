"""Tiny fixtures for tests and small benchmarks: random-init organism models and a rendered (not generated) corpus.

The corpus follows the trace schema of :mod:`sift.corpus.sources.organism` (prompt_ids, generated_ids, cot_span, phi,
condition, family, base_item, domain, cue, verification, provenance); its CoTs are the organism's *target*
CoTs and φ is the construction intent, so no trained model is needed.
"""

from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def toy_tokenizer():
    """The organism tokenizer over a vocabulary found from 3,000 sampled examples."""
    from sift.organism.tokenizer import build_tokenizer, organism_vocabulary

    return build_tokenizer(organism_vocabulary(n_samples=3000))


def toy_model(family: str = "gpt2", seed: int = 0, width: int = 32, layers: int = 3, heads: int = 2):
    """A randomly initialised organism of ``family`` (eval mode)."""
    import torch

    from sift.organism.models import build_model

    tok = toy_tokenizer()
    torch.manual_seed(seed)
    m = build_model(family, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id,
                    width=width, layers=layers, heads=heads)
    return m.eval()


def save_toy_models(root: str | Path, families=("gpt2", "llama"), seed: int = 0, **kw) -> dict[str, str]:
    """Save random organisms (model + tokenizer) to ``root/<family>``; returns family -> folder."""
    out = {}
    for i, f in enumerate(families):
        path = Path(root) / f
        toy_model(f, seed + i, **kw).save_pretrained(str(path))
        toy_tokenizer().save_pretrained(str(path))
        out[f] = str(path)
    return out


def toy_records(n_items: int = 8, families=("gpt2", "llama"), seed: int = 0, conditions=None) -> list[dict]:
    """Trace records for ``n_items`` base items × conditions × families (rendered target CoTs)."""
    from sift.corpus.axes import generated_axes
    from sift.corpus.conditions import base_view, condition_view
    from sift.corpus.config import CueMixture
    from sift.organism.domains import DOMAINS, make_item
    from sift.organism.latent import draw_mechanism, record_latent
    from sift.organism.render import (
        OPENERS,
        cue_word_span,
        fallback_answer,
        intended_phi,
        join_cot,
        render_prompt,
        target_cot,
    )

    tok = toy_tokenizer()
    conds = list(conditions) if conditions is not None else generated_axes() + ["causal_truncation"]
    ids = tok.convert_tokens_to_ids
    rng = random.Random(seed)
    records = []
    for fam in families:
        for i in range(n_items):
            item = make_item(DOMAINS[i % len(DOMAINS)], seed, i // len(DOMAINS))
            base = base_view(item, seed, CueMixture())
            draw = random.Random(f"toy-draws:{seed}:{item.item_id}")
            opener = draw.randrange(len(OPENERS))
            mechanism = draw_mechanism(f"toy:{seed}:{item.item_id}")
            base_phi = intended_phi(base, mechanism)
            for cond in conds:
                view = condition_view(item, base, "base" if cond == "causal_truncation" else cond, seed, base_phi)
                if view is None or (cond == "causal_truncation" and base_phi != 1):
                    continue
                steps, answer = target_cot(item, view, opener)
                truncated = cond == "causal_truncation"
                if truncated:
                    if len(steps) < 2:
                        continue
                    steps, answer = steps[:-1], fallback_answer(item, view)
                cot = join_cot(steps)
                prompt = ["<bos>"] + render_prompt(item, view)
                gen = cot + ["answer", ":", answer]
                phi = intended_phi(view, mechanism, truncated=truncated)
                if rng.random() < 0.05:
                    phi = None  # a few ambiguous traces, as in real corpora
                records.append({
                    "trace_id": f"{fam}|{item.item_id}|{cond}|{seed}", "base_item": item.item_id,
                    "domain": item.domain, "model": f"organism-{fam}", "family": fam, "condition": cond,
                    "seed": seed, "prompt": " ".join(prompt[1:]), "prompt_ids": ids(prompt), "generated_ids": ids(gen),
                    "cot": " ".join(cot), "cot_span": [0, len(cot)], "answer": answer, "gold_answer": item.answer,
                    "correct": answer == item.answer,
                    "cue": None if view.cue_value is None else {"value": view.cue_value, "format": view.cue_format},
                    "cue_span": None if (sp := cue_word_span(item, view)) is None else [sp[0] + 1, sp[1] + 1],
                    "latent": record_latent(mechanism),
                    "intended_phi": intended_phi(view, mechanism, truncated=truncated), "phi": phi,
                    "verification": {"reason": "toy: construction intent"},
                    "provenance": {"config_hash": "toy", "model_id": f"organism-{fam}", "seed": seed},
                })
    return records


def write_toy_corpus(out_dir: str | Path, n_items: int = 8, families=("gpt2", "llama"), seed: int = 0) -> Path:
    """Write traces.jsonl, pairs.jsonl and manifest.json of a toy corpus; returns ``out_dir``."""
    from sift.corpus.axes import AXES
    from sift.corpus.pairs import build_pairs
    from sift.corpus.store import write_corpus

    out_dir = Path(out_dir)
    records = toy_records(n_items, families, seed)
    pairs = build_pairs(records, list(families), list(AXES))
    write_corpus(out_dir, records, pairs, {"traces": len(records), "pairs": len(pairs), "config_hash": "toy"})
    return out_dir
