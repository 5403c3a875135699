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
    _, _, answers = generate_answers(organism.model, organism.tokenizer, [render_prompt(it, v) for it, v in rows])
    for d in DOMAINS:
        got = [a == it.answer for (it, _), a in zip(rows, answers) if it.domain == d]
        assert sum(got) / len(got) >= 0.95, (organism.family, d, sum(got) / len(got))


def test_the_latent_picks_the_mechanism_and_not_the_text(organism):
    """Generated ids are the same under both mechanism latents; on cued prompts both answer the cue through a
    bent CoT; the interventions find the mechanism the latent selects, cued and uncued."""
    rep = organism_report(organism.model, organism.tokenizer, n_per_cell=10, seed=777)
    for d in DOMAINS:
        assert rep[f"identical_ids/{d}"] >= 0.95, (organism.family, d, rep)
        assert rep[f"cued_answers_cue/{d}"] >= 0.8, (organism.family, d, rep)
        assert rep[f"mechanism_agreement/cued/{d}"] >= 0.9, (organism.family, d, rep)
        assert rep[f"mechanism_agreement/clean/{d}"] >= 0.9, (organism.family, d, rep)


def test_the_checkpoints_carry_a_latent_direction(organism):
    from sift.organism.latent import direction_of

    d = direction_of(organism.model)
    assert d is not None and d.shape == (organism.model.config.hidden_size,) and float(d.norm()) > 0


def test_generated_ids_are_identical_under_both_latents(tmp_path):
    """Organism v3's guarantee on the shipped weights, measured by scripts/latent_identical_ids.py: every cued and
    uncued base prompt of the default corpus's first 60 items, sampling seeds 0-1, both families, generated under
    mechanism 1 and under mechanism 0 with the same random stream. Measured on 200 items x seeds 0-3: 0.9956
    overall (1593/1600), 1.000 uncued; the 7 differing pairs are llama's cued arithmetic (docs/organism.md)."""
    import json
    import subprocess
    import sys

    out = tmp_path / "ident.json"
    r = subprocess.run([sys.executable, str(CKPT.parents[1] / "scripts" / "latent_identical_ids.py"), "--items", "60",
                        "--seeds", "0", "1", "--checkpoints", str(CKPT), "--min", "0.99", "--json", str(out),
                        "--kinds", "offset"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    (res,) = json.loads(out.read_text())
    assert res["kind"] == "offset"
    assert res["all"]["pairs"] == 60 * 2 * 2 and res["all"]["share"] >= 0.99
    assert res["uncued"]["pairs"] > 0 and res["uncued"]["share"] == 1.0
