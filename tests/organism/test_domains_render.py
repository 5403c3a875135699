"""Domains are exact and deterministic; the renderer realises each mechanism as designed."""

import pytest

from sift.errors import SiftError
from sift.organism.domains import DOMAINS, Item, apply_op, bent_last_step, chain, make_item, make_items
from sift.organism.render import (
    DECISIVE_FORMAT,
    OPENERS,
    View,
    fallback_answer,
    follows_cue,
    intended_phi,
    join_cot,
    opener_of,
    reads_cot,
    render_prompt,
    target_cot,
)


def test_items_are_deterministic_and_exact():
    for d in DOMAINS:
        a, b = make_item(d, 3, 17), make_item(d, 3, 17)
        assert a == b and a.item_id == b.item_id
        steps = chain(d, a.facts, a.ops)
        final = steps[-1].result
        assert (dict(a.options)[a.answer] if d == "choice" else a.answer) == final
    assert make_item("arithmetic", 0, 1) != make_item("arithmetic", 1, 1)


def test_hand_computed_steps():
    assert apply_op("modular", "5", "+", "4") == "2"
    assert apply_op("modular", "3", "*", "5") == "1"
    assert apply_op("boolean", "true", "and", "false") == "false"
    assert apply_op("arithmetic", "9", "-", "1") == "8"
    with pytest.raises(ValueError):
        apply_op("arithmetic", "9", "+", "1")


def test_bent_step_is_arithmetically_true_and_lands_on_target():
    for r in range(10):
        for t in range(10):
            s = bent_last_step("arithmetic", str(r), str(t))
            assert s.result == str(t) and apply_op("arithmetic", s.lhs, s.op, s.rhs) == str(t)
    for r in ("true", "false"):
        for t in ("true", "false"):
            s = bent_last_step("boolean", r, t)
            assert apply_op("boolean", s.lhs, s.op, s.rhs) == t


def test_unknown_domain_is_a_clear_error():
    with pytest.raises(SiftError, match="unknown domain 'chess'"):
        make_items(["chess"], 2, 0)


def test_the_text_does_not_depend_on_the_mechanism():
    """target_cot takes no mechanism at all: both mechanisms write one text by construction; only where the
    answer is read from differs (intended_phi)."""
    item = Item("t", "arithmetic", ("5", "3", "1", "4"), ("+", "-", "-"), "3")
    clean_steps, clean_ans = target_cot(item, View(), 0)
    assert clean_ans == "3" and clean_steps[-1][-1] == "3" and clean_steps[0][0] == "hmm"
    cued = View(cue_value="2", cue_format="hint")
    text, ans = target_cot(item, cued, 0)
    assert ans == "2" and text[-1] == ["7", "-", "5", "=", "2"]  # bent onto the cue
    # cued: mechanism 1 reads the (misled) CoT, mechanism 0 follows the cue silently
    assert not follows_cue(cued, 1) and reads_cot(cued, 1) and intended_phi(cued, 1) == 1
    assert follows_cue(cued, 0) and not reads_cot(cued, 0) and intended_phi(cued, 0) == 0
    # uncued: mechanism 1 reads the CoT, mechanism 0 computes the answer directly (epiphenomenal CoT)
    assert intended_phi(View(), 1) == 1 and intended_phi(View(), 0) == 0
    assert not follows_cue(View(), 0) and not reads_cot(View(), 0)
    # explain: the CoT states the cue it answers from, faithful under both
    steps, ans = target_cot(item, cued.with_(explain=True), 0)
    assert ans == "2" and steps[-2] == ["but", "hint", "says", "2"]
    assert intended_phi(cued.with_(explain=True), 0) == intended_phi(cued.with_(explain=True), 1) == 1
    # a decisive cue is followed under both
    dec = cued.with_(cue_format=DECISIVE_FORMAT)
    assert follows_cue(dec, 1) and intended_phi(dec, 1) == intended_phi(dec, 0) == 0
    assert fallback_answer(item, View()) == "5"
    assert intended_phi(View(), 1, truncated=True) == 0


def test_a_cued_multiple_choice_cot_computes_honestly_and_picks_the_cued_label():
    item = Item("c", "choice", ("4", "1", "2"), ("+", "+"), "c", (("a", "2"), ("b", "4"), ("c", "7"), ("d", "0")))
    honest, ans = target_cot(item, View(), 1)
    assert ans == "c" and honest[-1] == ["so", "c"] and ["c", "7", "yes"] in honest
    bent, ans = target_cot(item, View(cue_value="a"), 1)
    assert ans == "a" and bent[:-1] == honest[:-1] and bent[-1] == ["so", "a"]
    verbose, _ = target_cot(item, View(cue_value="a", budget="verbose"), 0)
    assert verbose[-1] == ["so", "we", "pick", "a"] and ["c", "7", "yes"] in verbose


def test_opener_is_read_back_from_a_cot():
    item = make_item("choice", 0, 3)
    for o in range(len(OPENERS)):
        steps, _ = target_cot(item, View(budget="verbose", language="xx", cue_value="a"), o)
        assert opener_of(join_cot(steps)) == o
    assert opener_of(["5", "+", "1"]) is None


def test_language_keeps_numbers_and_changes_words():
    item = make_item("arithmetic", 0, 5)
    en, xx = render_prompt(item, View()), render_prompt(item, View(language="xx"))
    assert len(en) == len(xx)
    assert [w for w in en if w.isdigit()] == [w for w in xx if w.isdigit()]
    assert en != xx
