"""Accuracy and mechanism rates of a trained organism, measured by greedy generation."""

from __future__ import annotations

import random
from collections import defaultdict

from sift.lm.generation import generate_ids
from sift.organism.domains import DOMAINS, make_item
from sift.organism.render import BUDGETS, CUE_FORMATS, DECISIVE_FORMAT, LANGUAGES, View, follows_cue, render_prompt


def parse_organism_answer(words: list[str]) -> str | None:
    """The value after the last ``answer :`` marker, or None."""
    for i in range(len(words) - 2, -1, -1):
        if words[i] == "answer" and words[i + 1] == ":":
            return words[i + 2] if i + 2 < len(words) else None
    return None


def generate_answers(model, tok, prompts: list[list[str]], max_new_tokens: int = 64) -> tuple[list[list[str]], list[str | None]]:
    ids = [tok.convert_tokens_to_ids(["<bos>"] + p) for p in prompts]
    gens = generate_ids(model, ids, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, max_new_tokens=max_new_tokens)
    words = [tok.convert_ids_to_tokens(g.new_ids) for g in gens]
    return words, [parse_organism_answer(w) for w in words]


def organism_report(model, tok, n_per_cell: int = 50, seed: int = 12345) -> dict:
    """Clean accuracy per domain × budget × language, and cue-following rates (held-out items: seed ≠ training)."""
    rng = random.Random(seed)
    rows = []
    for d in DOMAINS:
        for i in range(n_per_cell * 4):
            it = make_item(d, seed, i)
            b, lang = BUDGETS[i % 2], LANGUAGES[(i // 2) % 2]
            rows.append(("clean", it, View(template=rng.randrange(2), language=lang, budget=b)))
            other = rng.choice([v for v in it.answer_space if v != it.answer])
            fmt = DECISIVE_FORMAT if i % 5 == 0 else CUE_FORMATS[i % 4]
            rows.append(("cued", it, View(template=rng.randrange(2), language=lang, budget=b, cue_value=other,
                                          cue_format=fmt)))
    _, answers = generate_answers(model, tok, [render_prompt(it, v) for _, it, v in rows])
    acc = defaultdict(list)
    for (kind, it, v), a in zip(rows, answers):
        if kind == "clean":
            acc[f"clean/{it.domain}"].append(a == it.answer)
            acc[f"clean/{it.domain}/{v.budget}"].append(a == it.answer)
            acc[f"clean/{it.domain}/{v.language}"].append(a == it.answer)
        else:
            want = v.cue_value if follows_cue(it, v) else it.answer
            key = "follow" if follows_cue(it, v) else "resist"
            acc[f"cued_{key}/{it.domain}"].append(a == want)
    return {k: round(sum(x) / len(x), 4) for k, x in sorted(acc.items())}
