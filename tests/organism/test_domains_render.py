"""Domains are exact and deterministic; the renderer realises each mechanism as designed."""

import pytest

from sift.errors import SiftError
from sift.organism.domains import DOMAINS, Item, apply_op, bent_last_step, chain, make_item, make_items
from sift.organism.render import (
    DECISIVE_FORMAT,
    Choices,
    View,
    fallback_answer,
    follows_cue,
    intended_phi,
    join_cot,
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


def test_mechanisms_share_one_text_and_differ_only_in_the_draws():
    item = Item("t", "arithmetic", ("5", "3", "1", "4"), ("+", "-", "-"), "3")
    agree, disagree = Choices(0, 0), Choices(1, 0)
    clean_steps, clean_ans = target_cot(item, View(), agree)
    assert clean_ans == "3" and clean_steps[-1][-1] == "3"
    assert clean_steps[0][0] == "hmm" and clean_steps[0][-1] == "right"  # the two choice points
    cued = View(cue_value="2", cue_format="hint")
    text_f, ans_f = target_cot(item, cued, agree)
    text_u, ans_u = target_cot(item, cued, disagree)
    # both mechanisms bend the last step onto the cue and answer it: only the draws' words differ
    assert ans_f == ans_u == "2" and text_f[-1] == text_u[-1] == ["7", "-", "5", "=", "2"]
    assert text_f[1:] == text_u[1:] and text_f[0][1:] == text_u[0][1:]
    assert not follows_cue(item, cued, agree) and intended_phi(item, cued, agree) == 1  # misled, faithful, wrong
    assert follows_cue(item, cued, disagree) and intended_phi(item, cued, disagree) == 0  # silent cue following
    assert follows_cue(item, cued, Choices(0, 1)) and not follows_cue(item, cued, Choices(1, 1))
    steps, ans = target_cot(item, cued.with_(explain=True), agree)
    assert ans == "2" and steps[-2] == ["but", "hint", "says", "2"]
    assert intended_phi(item, cued.with_(explain=True), agree) == 1
    assert follows_cue(item, cued.with_(cue_format=DECISIVE_FORMAT), agree)
    assert not follows_cue(item, View(), disagree)  # no cue: the draws change nothing
    assert fallback_answer(item, View()) == "5"
    assert intended_phi(item, View(), agree, truncated=True) == 0


def test_choices_are_read_back_from_a_cot():
    item = make_item("choice", 0, 3)
    for c in (Choices(0, 0), Choices(0, 1), Choices(1, 0), Choices(1, 1)):
        steps, _ = target_cot(item, View(budget="verbose", language="xx", cue_value="a"), c)
        assert Choices.from_cot(join_cot(steps)) == c
    assert Choices.from_cot(["5", "+", "1"]) is None


def test_language_keeps_numbers_and_changes_words():
    item = make_item("arithmetic", 0, 5)
    en, xx = render_prompt(item, View()), render_prompt(item, View(language="xx"))
    assert len(en) == len(xx)
    assert [w for w in en if w.isdigit()] == [w for w in xx if w.isdigit()]
    assert en != xx
