"""The mechanism card's interventions (attention knockout, head-output patching) against hand computations on a toy
model, and the card's measurements on the shipped organism: what each mechanism kind's hidden states carry."""

from __future__ import annotations

import math

import pytest
import torch

from sift.lm.states import capture, head_outputs, head_projections, knockout
from sift.trajectories.toy import toy_model


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def toy(request):
    torch.manual_seed(0)
    return toy_model(request.param, seed=7).eval()


def test_knockout_removes_exactly_the_dropped_keys(toy):
    """Knocking out key k for query q: the captured attention row puts 0 on k and renormalises the rest (the same
    row, k removed, divided by 1 − its old weight); other queries are untouched; nothing dropped = the plain model."""
    ids = torch.tensor([[1, 5, 6, 7, 8, 9]])
    S = ids.shape[1]
    L = len(head_projections(toy))
    with torch.no_grad(), capture(toy, attention=[0], heads="all") as cap:
        plain = toy(input_ids=ids).logits
    a0 = cap.attention[0][0]  # [H, S, S]
    drop = torch.zeros(1, S, S, dtype=torch.bool)
    with torch.no_grad(), knockout(toy, drop):
        same = toy(input_ids=ids).logits
    torch.testing.assert_close(same, plain, atol=1e-5, rtol=1e-4)
    drop[0, S - 1, 2] = True
    with torch.no_grad(), knockout(toy, drop), capture(toy, attention=list(range(L)), heads="all") as cap:
        cut = toy(input_ids=ids).logits
    a1 = cap.attention[0][0]
    assert float(a1[:, S - 1, 2].abs().max()) == 0.0
    want = a0[:, S - 1].clone()
    want[:, 2] = 0
    want = want / (1 - a0[:, S - 1, 2])[:, None]
    torch.testing.assert_close(a1[:, S - 1], want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(cut[0, : S - 1], plain[0, : S - 1], atol=1e-5, rtol=1e-4)  # earlier queries
    assert not torch.allclose(cut[0, S - 1], plain[0, S - 1])


def test_head_outputs_read_and_patch_one_position(toy):
    """Patching a head with its own output changes nothing; patching it with zeros equals zeroing that slice of
    the output projection's input by hand."""
    ids = torch.tensor([[1, 5, 6, 7, 8, 9], [1, 8, 9, 5, 6, 7]])
    pos = torch.tensor([5, 3])
    with torch.no_grad(), head_outputs(toy, pos) as got:
        plain = toy(input_ids=ids).logits
    H = toy.config.num_attention_heads
    dh = toy.config.hidden_size // H
    assert len(got) == len(head_projections(toy)) * H and got[(0, 0)].shape == (2, dh)
    with torch.no_grad(), head_outputs(toy, pos, patch={(1, 1): got[(1, 1)]}):
        torch.testing.assert_close(toy(input_ids=ids).logits, plain)
    proj = head_projections(toy)[1]

    def zero(_m, args):
        x = args[0].clone()
        x[torch.arange(2), pos, 1 * dh:2 * dh] = 0
        return (x,)

    h = proj.register_forward_pre_hook(zero)
    with torch.no_grad():
        by_hand = toy(input_ids=ids).logits
    h.remove()
    with torch.no_grad(), head_outputs(toy, pos, patch={(1, 1): torch.zeros(2, dh)}):
        patched = toy(input_ids=ids).logits
    torch.testing.assert_close(patched, by_hand)
    assert not torch.allclose(patched, plain)


@pytest.fixture(scope="module")
def shipped_gpt2():
    from sift.lm.loading import load_causal_lm
    from sift.organism import DEFAULT_CHECKPOINTS

    return load_causal_lm(str(DEFAULT_CHECKPOINTS / "gpt2"))


@pytest.fixture(scope="module")
def cards(shipped_gpt2):
    from sift.organism.mechanism import mechanism_card

    model, tok = shipped_gpt2
    return {k: mechanism_card(model, tok, k, "gpt2", n_per_cell=6) for k in ("offset", "answer_routing")}


def test_answer_routing_cot_states_carry_nothing_and_offset_plants_the_latent(cards):
    """answer_routing: every twin difference at CoT positions is exactly 0, so every linear read there is 0.5, while
    the answer position reads z perfectly; offset: the CoT positions read z almost perfectly (the planted offset)."""
    ar, off = cards["answer_routing"], cards["offset"]
    assert ar.cot_difference == [0.0] * 4 and ar.top_direction_share == [None] * 4
    assert ar.linear["last CoT token"] == [0.5] * 4 and ar.linear["CoT mean"] == [0.5] * 4
    assert min(ar.linear["answer position"]) >= 0.95
    assert min(off.cot_difference) > 0.02 and min(off.linear["CoT mean"][:2]) >= 0.9


def test_the_decision_is_made_at_the_answer_line_by_routing(cards):
    """On the shipped weights the behaviour appears with the latent switched on only at the answer line; knocking
    out the answer's attention to the CoT's result stops z=+1 from following the CoT edit (not the cue's knockout),
    and z=−1 follows the cue unless the cue is knocked out."""
    for c in cards.values():
        assert c.onset["answer line"] >= 0.95 and c.onset[f"as {c.kind}"] >= 0.95
        k = c.knockout
        assert k["z=+1, knock out nothing"]["answers CoT edit"] >= 0.95
        assert k["z=+1, knock out CoT result"]["answers CoT edit"] <= 0.5
        assert k["z=+1, knock out cue"]["answers CoT edit"] >= 0.95
        assert k["z=-1, knock out nothing"]["answers cue"] >= 0.95
        assert k["z=-1, knock out CoT result"]["answers cue"] >= 0.95
        assert k["z=-1, knock out cue"]["answers cue"] <= 0.8
        assert c.patching["none"] <= 0.05 and max(c.patching.values()) >= 0.4  # the routing heads carry the switch
        assert math.isclose(sum(1 for h in c.heads if (h["z_auroc"] or 0.5) > 0.9), 3, abs_tol=2)
