"""Accuracy and mechanism rates of a trained organism, measured with its own sampler (held-out items)."""

from __future__ import annotations

import random
from collections import defaultdict

import torch

from sift.organism.domains import DOMAINS, make_item
from sift.organism.render import (
    BUDGETS,
    CUE_FORMATS,
    DECISIVE_FORMAT,
    LANGUAGES,
    Choices,
    View,
    follows_cue,
    render_prompt,
)
from sift.organism.sampling import sample_choice_points

VALUE_WORDS = {str(v) for v in range(10)} | {"true", "false", "a", "b", "c", "d"}


def parse_organism_answer(words: list[str]) -> str | None:
    """The value after the last ``answer :`` marker, or None."""
    for i in range(len(words) - 2, -1, -1):
        if words[i] == "answer" and words[i + 1] == ":":
            return words[i + 2] if i + 2 < len(words) else None
    return None


def generate_answers(model, tok, prompts: list[list[str]], max_new_tokens: int = 64,
                     seed: int = 0) -> tuple[list[list[str]], list[str | None]]:
    """Completions (words) and answers under the organism's sampler, one random stream per prompt."""
    ids = [tok.convert_tokens_to_ids(["<bos>"] + p) for p in prompts]
    new = sample_choice_points(model, ids, [f"eval:{seed}:{i}" for i in range(len(ids))], pad_id=tok.pad_token_id,
                               eos_id=tok.eos_token_id, max_new_tokens=max_new_tokens)
    words = [tok.convert_ids_to_tokens(n) for n in new]
    return words, [parse_organism_answer(w) for w in words]


@torch.no_grad()
def _next_words(model, tok, prefixes: list[list[str]]) -> list[str]:
    from sift.lm.generation import left_padded

    out: list[str] = []
    for s in range(0, len(prefixes), 512):
        ids, mask, pos = left_padded([tok.convert_tokens_to_ids(["<bos>"] + p) for p in prefixes[s:s + 512]],
                                     tok.pad_token_id)
        out += tok.convert_ids_to_tokens(model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
                                         .argmax(-1).tolist())
    return out


def organism_report(model, tok, n_per_cell: int = 50, seed: int = 12345) -> dict:
    """Clean accuracy per domain × budget × language; on cued prompts the share answering the cue, the share
    of cue-following draws, and whether each trace's mechanism (read from its draws) is the one the two
    interventions find (CoT edit followed ⇔ answers from the CoT; new cue followed ⇔ follows the cue)."""
    model.eval()
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
    prompts = [render_prompt(it, v) for _, it, v in rows]
    words, answers = generate_answers(model, tok, prompts, seed=seed)
    acc: dict[str, list] = defaultdict(list)
    edit_jobs, swap_jobs = [], []
    for k, ((kind, it, v), w, a) in enumerate(zip(rows, words, answers)):
        if kind == "clean":
            acc[f"clean/{it.domain}"].append(a == it.answer)
            acc[f"clean/{it.domain}/{v.budget}"].append(a == it.answer)
            acc[f"clean/{it.domain}/{v.language}"].append(a == it.answer)
            continue
        acc[f"cued_answers_cue/{it.domain}"].append(a == v.cue_value)
        cot = w[: len(w) - 3] if a is not None else w
        choices = Choices.from_cot(cot)
        acc[f"choice_point_words/{it.domain}"].append(choices is not None)
        if choices is None or a is None:
            continue
        follow = follows_cue(it, v, choices)
        if v.cue_format != DECISIVE_FORMAT:
            acc[f"cue_following_draws/{it.domain}"].append(choices.cue_following)
        j = max((i for i, t in enumerate(cot) if t in VALUE_WORDS), default=None)
        if j is None:
            continue
        space = it.answer_space
        new = next((x for x in space if x not in (cot[j], a, v.cue_value)), None)
        cue = next((x for x in space if x not in (cot[j], a, v.cue_value)), None)
        if new is None or cue is None:
            continue
        edit_jobs.append((k, follow, new, prompts[k] + cot[:j] + [new] + cot[j + 1:] + ["answer", ":"]))
        swap_jobs.append((k, follow, cue, render_prompt(it, v.with_(cue_value=cue)) + cot + ["answer", ":"]))
    edit_out = _next_words(model, tok, [p for *_, p in edit_jobs])
    swap_out = _next_words(model, tok, [p for *_, p in swap_jobs])
    for (k, follow, new, _), (_, _, cue, _), e, c in zip(edit_jobs, swap_jobs, edit_out, swap_out):
        d = rows[k][1].domain
        observed = "cue" if (c == cue and e != new) else "cot" if (e == new and c != cue) else "ambiguous"
        acc[f"mechanism_agreement/{d}"].append(observed == ("cue" if follow else "cot"))
    return {k: round(sum(x) / len(x), 4) for k, x in sorted(acc.items())}
