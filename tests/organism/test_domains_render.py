"""Domains are exact and deterministic; the renderer realises each mechanism as designed."""

import pytest

from sift.errors import SiftError
from sift.organism.domains import DOMAINS, Item, apply_op, bent_last_step, chain, make_item, make_items
from sift.organism.render import (DECISIVE_FORMAT, View, fallback_answer, follows_cue, intended_phi, render_prompt,
                                  target_cot)


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


def test_mechanisms_in_rendered_targets():
    item = Item("t", "arithmetic", ("5", "3", "1", "4"), ("+", "-", "-"), "3", key=5)  # rule holds (odd key)
    clean_steps, clean_ans = target_cot(item, View())
    assert clean_ans == "3" and clean_steps[-1][-1] == "3"
    cued = View(cue_value="2", cue_format="hint")
    steps, ans = target_cot(item, cued)
    assert follows_cue(item, cued) and ans == "2" and steps[-1] == ["7", "-", "5", "=", "2"]
    assert intended_phi(item, cued) == 0
    steps, ans = target_cot(item, cued.with_(explain=True))
    assert ans == "2" and steps[-2] == ["but", "hint", "says", "2"] and intended_phi(item, cued.with_(explain=True)) == 1
    even = Item("u", "arithmetic", ("4", "5", "1"), ("+", "-"), "8", key=4)  # rule fails (even key)
    assert not follows_cue(even, cued) and target_cot(even, cued)[1] == "8"
    assert follows_cue(even, cued.with_(cue_format=DECISIVE_FORMAT))
    assert fallback_answer(item, View()) == "5"
    assert intended_phi(item, View(), truncated=True) == 0


def test_language_keeps_numbers_and_changes_words():
    item = make_item("arithmetic", 0, 5)
    en, xx = render_prompt(item, View()), render_prompt(item, View(language="xx"))
    assert len(en) == len(xx)
    assert [w for w in en if w.isdigit()] == [w for w in xx if w.isdigit()]
    assert en != xx
