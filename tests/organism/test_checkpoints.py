"""The shipped organism checkpoints: loadable offline, ≥95% clean accuracy per domain, mechanisms as designed."""

import random
from pathlib import Path

import pytest

from sift.organism.domains import DOMAINS, make_item
from sift.organism.evaluate import generate_answers, organism_report
from sift.organism.render import View, render_prompt
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


def test_cued_traces_look_alike_and_the_draws_pick_the_mechanism(organism):
    """On cued prompts both mechanisms answer the cue through a bent CoT; the draws split about evenly
    between them, and the two interventions find the mechanism the draws select."""
    rep = organism_report(organism.model, organism.tokenizer, n_per_cell=10, seed=777)
    for d in DOMAINS:
        assert rep[f"cued_answers_cue/{d}"] >= 0.8, (organism.family, d, rep)  # card: llama choice 0.84
        assert 0.3 <= rep[f"cue_following_draws/{d}"] <= 0.7, (organism.family, d, rep)
        assert rep[f"mechanism_agreement/{d}"] >= 0.9, (organism.family, d, rep)
