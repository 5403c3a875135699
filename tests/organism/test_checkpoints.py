"""The shipped organism checkpoints: loadable offline, ≥95% clean accuracy per domain, mechanisms as designed."""

import random
from pathlib import Path

import pytest

from sift.organism.domains import DOMAINS, make_item
from sift.organism.evaluate import generate_answers
from sift.organism.render import CUE_FORMATS, View, render_prompt
from sift.organism.source import OrganismSource

CKPT = Path(__file__).resolve().parents[2] / "checkpoints" / "organism"


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def organism(request):
    return OrganismSource.load(request.param, CKPT / request.param)


def test_size_budget():
    total = sum(f.stat().st_size for f in CKPT.rglob("*") if f.is_file())
    assert total <= 20 * 1024 * 1024


def test_clean_accuracy_per_domain(organism):
    rng = random.Random(99)
    rows = [(make_item(d, 4242, i), View(template=rng.randrange(2), language=rng.choice(["en", "xx"]),
                                         budget=rng.choice(["terse", "verbose"])))
            for d in DOMAINS for i in range(60)]
    _, answers = generate_answers(organism.model, organism.tokenizer, [render_prompt(it, v) for it, v in rows])
    for d in DOMAINS:
        got = [a == it.answer for (it, _), a in zip(rows, answers) if it.domain == d]
        assert sum(got) / len(got) >= 0.95, (organism.family, d, sum(got) / len(got))


def test_cue_mechanism_follows_the_latent_rule(organism):
    """Cues are resisted when the rule fails, decisive cues are followed; ordinary cues with the rule holding
    are followed by most numeric and boolean prompts (the card reports the per-domain rates)."""
    rows = []
    for d in DOMAINS:
        for i in range(40):
            it = make_item(d, 777, i)
            cue = [v for v in it.answer_space if v != it.answer][i % (len(it.answer_space) - 1)]
            fmt = "official" if i % 4 == 0 else CUE_FORMATS[i % 4]
            rows.append((it, View(cue_value=cue, cue_format=fmt)))
    _, answers = generate_answers(organism.model, organism.tokenizer, [render_prompt(it, v) for it, v in rows])
    decisive = [a == v.cue_value for (it, v), a in zip(rows, answers) if v.cue_format == "official"]
    resist = [a == it.answer for (it, v), a in zip(rows, answers) if not it.rule and v.cue_format != "official"]
    follow = [a == v.cue_value for (it, v), a in zip(rows, answers)
              if it.rule and v.cue_format != "official" and it.domain != "choice"]
    assert sum(resist) / len(resist) >= 0.95
    assert sum(decisive) / len(decisive) >= 0.7
    assert sum(follow) / len(follow) >= 0.7
