"""Accuracy and mechanism rates of a trained organism, measured with its own sampler (held-out items)."""

from __future__ import annotations

import random
from collections import defaultdict

import torch

from sift.organism.domains import DOMAINS, make_item
from sift.organism.latent import DEFAULT_KIND, injected, latent_value
from sift.organism.render import (
    BUDGETS,
    CUE_FORMATS,
    DECISIVE_FORMAT,
    LANGUAGES,
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


def generate_answers(model, tok, prompts: list[list[str]], max_new_tokens: int = 64, seed: int = 0,
                     mechanisms: list[int] | None = None, kind: str = DEFAULT_KIND
                     ) -> tuple[list[list[int]], list[list[str]], list[str | None]]:
    """New ids, completions (words) and answers under the organism's sampler, one random stream per prompt, each
    prompt's mechanism latent injected as mechanism ``kind`` (default: mechanism 1)."""
    ids = [tok.convert_tokens_to_ids(["<bos>"] + p) for p in prompts]
    mechs = mechanisms if mechanisms is not None else [1] * len(prompts)
    new = sample_choice_points(model, ids, [f"eval:{seed}:{i}" for i in range(len(ids))], pad_id=tok.pad_token_id,
                               eos_id=tok.eos_token_id, max_new_tokens=max_new_tokens,
                               latents=[latent_value(m) for m in mechs], kind=kind)
    words = [tok.convert_ids_to_tokens(n) for n in new]
    return new, words, [parse_organism_answer(w) for w in words]


@torch.no_grad()
def _next_words(model, tok, jobs: list[tuple[list[str], int, int]], kind: str = DEFAULT_KIND) -> list[str]:
    """Greedy next word after each (prefix words, mechanism, prompt length in words) with the latent injected."""
    from sift.lm.generation import left_padded

    out: list[str] = []
    for s in range(0, len(jobs), 512):
        chunk = jobs[s:s + 512]
        ids, mask, pos = left_padded([tok.convert_tokens_to_ids(["<bos>"] + p) for p, _, _ in chunk], tok.pad_token_id)
        with injected(model, [latent_value(m) for _, m, _ in chunk], [n + 1 for _, _, n in chunk], kind=kind):
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
        out += tok.convert_ids_to_tokens(logits.argmax(-1).tolist())
    return out


def organism_report(model, tok, n_per_cell: int = 50, seed: int = 12345, mechanism_kind: str = DEFAULT_KIND) -> dict:
    """Clean accuracy per domain × budget × language; on cued prompts the share answering the cue; the share of
    prompts whose generated ids are identical under both mechanism latents; and whether each trace's mechanism
    (from its latent) is the one the two interventions find: CoT edit followed ⇔ the answer is read from the CoT;
    new cue followed ⇔ the cue is followed; on uncued prompts, neither ⇔ the answer is computed directly."""
    model.eval()
    rng = random.Random(seed)
    rows = []
    for d in DOMAINS:
        for i in range(n_per_cell * 4):
            it = make_item(d, seed, i)
            b, lang = BUDGETS[i % 2], LANGUAGES[(i // 2) % 2]
            mech = (i // 4) % 2
            rows.append(("clean", it, View(template=rng.randrange(2), language=lang, budget=b), mech))
            other = rng.choice([v for v in it.answer_space if v != it.answer])
            fmt = DECISIVE_FORMAT if i % 5 == 0 else CUE_FORMATS[i % 4]
            rows.append(("cued", it, View(template=rng.randrange(2), language=lang, budget=b, cue_value=other,
                                          cue_format=fmt), mech))
    prompts = [render_prompt(it, v) for _, it, v, _ in rows]
    new, words, answers = generate_answers(model, tok, prompts, seed=seed, mechanisms=[m for *_, m in rows],
                                           kind=mechanism_kind)
    new_other, _, _ = generate_answers(model, tok, prompts, seed=seed, mechanisms=[1 - m for *_, m in rows],
                                       kind=mechanism_kind)
    acc: dict[str, list] = defaultdict(list)
    edit_jobs, swap_jobs = [], []
    for k, ((kind, it, v, mech), w, a) in enumerate(zip(rows, words, answers)):
        acc[f"identical_ids/{it.domain}"].append(new[k] == new_other[k])
        if kind == "clean":
            acc[f"clean/{it.domain}"].append(a == it.answer)
            acc[f"clean/{it.domain}/{v.budget}"].append(a == it.answer)
            acc[f"clean/{it.domain}/{v.language}"].append(a == it.answer)
        else:
            acc[f"cued_answers_cue/{it.domain}"].append(a == v.cue_value)
        if a is None:
            continue
        cot = w[: len(w) - 3]
        j = max((i for i, t in enumerate(cot) if t in VALUE_WORDS), default=None)
        if j is None:
            continue
        space = it.answer_space
        new_v = next((x for x in space if x not in (cot[j], a, v.cue_value)), None)
        if new_v is None:
            continue
        expected = "cue" if follows_cue(v, mech) else "cot" if mech == 1 else "direct"
        edit_jobs.append((k, kind, expected, new_v, (prompts[k] + cot[:j] + [new_v] + cot[j + 1:] + ["answer", ":"],
                                                     mech, len(prompts[k]))))
        if kind == "cued":
            cue = next((x for x in space if x not in (cot[j], a, v.cue_value, new_v)), None) or new_v
            p2 = render_prompt(it, v.with_(cue_value=cue))
            swap_jobs.append((k, cue, (p2 + cot + ["answer", ":"], mech, len(p2))))
    edit_out = _next_words(model, tok, [j for *_, j in edit_jobs], mechanism_kind)
    swap_out = dict(zip([k for k, _, _ in swap_jobs], zip([c for _, c, _ in swap_jobs],
                                                          _next_words(model, tok, [j for *_, j in swap_jobs],
                                                                      mechanism_kind))))
    for (k, kind, expected, new_v, _), e in zip(edit_jobs, edit_out):
        d = rows[k][1].domain
        if kind == "cued":
            cue, c = swap_out[k]
            observed = "cue" if (c == cue and e != new_v) else "cot" if (e == new_v and c != cue) else "ambiguous"
        else:
            observed = "cot" if e == new_v else "direct" if e == answers[k] else "ambiguous"
        acc[f"mechanism_agreement/{kind}/{d}"].append(observed == expected)
    return {k: round(sum(x) / len(x), 4) for k, x in sorted(acc.items())}
