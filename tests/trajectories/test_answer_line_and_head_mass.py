"""Issue 43 item 3: the answer line's positions are flagged steps of the trajectory, and per-head attention mass on
the prompt / cue / generated tokens is a channel (hand computations on toy models), mapped onto a common shape."""

from __future__ import annotations

import pytest
import torch

from sift.errors import SiftError
from sift.lm.states import pack
from sift.trajectories.common_shape import ChannelLayout, channel_layout, channel_map
from sift.trajectories.extract import (
    ExtractConfig,
    Extractor,
    answer_line_positions,
    descriptor_channels,
    key_groups,
)
from sift.trajectories.toy import toy_model, toy_records, toy_tokenizer


@pytest.fixture(scope="module")
def records():
    recs = toy_records(4, families=("gpt2",))
    cued = [r for r in recs if r.get("cue_span")]
    return cued[:3] + [r for r in recs if not r.get("cue_span")][:2]


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def model(request):
    return toy_model(request.param)


def test_answer_line_positions_by_hand():
    r = {"generated_ids": [5, 6, 7, 8, 9, 10], "cot_span": [0, 3], "answer_span": [5, 6]}
    assert answer_line_positions(r, 4) == [3, 4]
    assert answer_line_positions(r, 1) == [4]
    assert answer_line_positions({**r, "answer_span": [3, 4]}, 4) == []
    assert answer_line_positions({**r, "answer": None, "answer_span": None}, 4) == []


def test_key_groups_split_prompt_cue_and_generated(records):
    tok = toy_tokenizer()
    p = pack([r["prompt_ids"] + r["generated_ids"] for r in records], tok.pad_token_id, "left")
    g = key_groups(records, p)
    for b, r in enumerate(records):
        o, P, G = int(p.offset[b]), len(r["prompt_ids"]), len(r["generated_ids"])
        assert float(g[b, :o].sum()) == 0.0  # padding belongs to no group
        assert torch.equal(g[b, o:].sum(-1), torch.ones(P + G))
        cue = g[b, o:o + P, 1].nonzero().flatten().tolist()
        span = r.get("cue_span")
        assert cue == (list(range(*span)) if span else [])
        if span:  # the cue's tokens are the cue's words
            words = tok.convert_ids_to_tokens(r["prompt_ids"][span[0]:span[1]])
            assert r["cue"]["value"] in words


def test_key_groups_clip_a_cue_span_to_the_prompt():
    """A cue span reaching outside the prompt is clipped to it; a record without one has no cue column."""
    recs = [{"prompt_ids": [1, 2, 3], "generated_ids": [4, 5], "cue_span": [-2, 9]},
            {"prompt_ids": [1, 2, 3, 4], "generated_ids": [5], "cue_span": [1, 3]},
            {"prompt_ids": [1], "generated_ids": [2, 3, 4]}]
    p = pack([r["prompt_ids"] + r["generated_ids"] for r in recs], 0, "left")  # width 5, offsets 0, 0, 1
    g = key_groups(recs, p).int()
    assert g[0].tolist() == [[0, 1, 0]] * 3 + [[0, 0, 1]] * 2
    assert g[1].tolist() == [[1, 0, 0], [0, 1, 0], [0, 1, 0], [1, 0, 0], [0, 0, 1]]
    assert g[2].tolist() == [[0, 0, 0], [1, 0, 0], [0, 0, 1], [0, 0, 1], [0, 0, 1]]


@torch.no_grad()
def test_steps_channels_and_masses_by_hand(model, records):
    """Each trace's steps are its binned CoT steps then its answer line's (``answer :``), flagged; a head's mass at an
    answer-line step is its attention, summed over the prompt (outside the cue), the cue and the generated tokens,
    read from the eager weights by hand; at every step the three masses of a head sum to 1."""
    tok = toy_tokenizer()
    cfg = ExtractConfig(interventions=[], t_max=4)
    ex = Extractor(model, cfg, tokenizer=tok)
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    assert ex.channels == descriptor_channels(L, H, L, True)
    out = ex.extract(records)
    C = len(ex.channels)
    base = 2 * L  # velocities, drifts, attention stability
    assert out["desc"].shape == (int(out["n_bins"].sum()), C)
    off = torch.cat([torch.zeros(1, dtype=torch.long), out["n_bins"].cumsum(0)])
    mass = out["desc"][:, base + 1:].reshape(-1, L, H, 3)
    torch.testing.assert_close(mass.sum(-1), torch.ones(mass.shape[:-1]), atol=1e-5, rtol=0)
    model.set_attn_implementation("eager")
    for b, r in enumerate(records):
        rows = out["desc"][off[b]:off[b + 1]]
        n_ans = int(out["n_answer"][b])
        assert n_ans == 2 and rows[:-n_ans, base].eq(0).all() and rows[-n_ans:, base].eq(1).all()
        assert int(out["n_bins"][b]) - n_ans == min(4, r["cot_span"][1])
        seq = r["prompt_ids"] + r["generated_ids"]
        att = model(input_ids=torch.tensor([seq]), output_attentions=True).attentions  # L × [1, H, S, S]
        P, span = len(r["prompt_ids"]), r.get("cue_span") or (0, 0)
        for k, gi in enumerate(answer_line_positions(r, cfg.answer_line_max)):
            q = P + gi
            for ly in range(L):
                a = att[ly][0, :, q]  # [H, S]
                cue = a[:, span[0]:span[1]].sum(-1)
                want = torch.stack([a[:, :P].sum(-1) - cue, cue, a[:, P:].sum(-1)], -1)
                got = mass[int(off[b + 1]) - n_ans + k, ly]
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        if span[1]:
            assert float(mass[off[b]:off[b + 1], :, :, 1].sum()) > 0
        else:
            assert float(mass[off[b]:off[b + 1], :, :, 1].sum()) == 0.0
    model.set_attn_implementation("sdpa")


@torch.no_grad()
def test_switches_off_give_the_cot_only_layout_and_the_same_cot_steps(records):
    """answer_line=false and head_mass_layers=0: the stored channels of before (velocity, drift, stability) and the
    very same numbers for the CoT's steps; the answer line adds rows after them and never changes them."""
    m, tok = toy_model("gpt2"), toy_tokenizer()
    plain = Extractor(m, ExtractConfig(interventions=[], answer_line=False, head_mass_layers=0), tokenizer=tok)
    assert plain.channels == descriptor_channels(3)
    a = plain.extract(records)
    assert torch.equal(a["n_answer"], torch.zeros(len(records), dtype=torch.long))
    full = Extractor(m, ExtractConfig(interventions=[]), tokenizer=tok)
    b = full.extract(records)
    cot = torch.cat([torch.arange(int(s), int(s) + int(n)) for s, n in
                     zip(torch.cat([torch.zeros(1, dtype=torch.long), b["n_bins"].cumsum(0)[:-1]]),
                         b["n_bins"] - b["n_answer"])])
    torch.testing.assert_close(b["desc"][cot, :len(plain.channels)], a["desc"], atol=1e-6, rtol=0)
    torch.testing.assert_close(b["final"][cot].float(), a["final"].float(), atol=1e-3, rtol=0)
    for k in ("pooled", "scalars", "answer_logp"):
        torch.testing.assert_close(b[k], a[k], atol=1e-6, rtol=0)
    two = Extractor(m, ExtractConfig(interventions=[], head_mass_layers=2), tokenizer=tok)
    assert [c for c in two.channels if c.startswith("head_mass/s")][-1] == "head_mass/s2/h1/cot"
    with pytest.raises(SiftError, match="answer_line_max must be ≥ 1"):
        ExtractConfig(answer_line_max=0).validate()


def test_channel_layout_and_map_by_hand():
    src = ChannelLayout(layers=3, heads=4, slots=3, answer_line=True)
    assert channel_layout(src.names()) == src
    with pytest.raises(SiftError, match="not the descriptor channels"):
        channel_layout(src.names()[:-1])
    tgt = ChannelLayout(layers=2, heads=2, slots=2, answer_line=True)
    idx = channel_map(src, tgt)
    names = [src.names()[i] for i in idx]
    # layers: velocity/l2 (into layer 3), drift/l2, drift/l3, stability; slots 2 and 3 (layer_map(3, 2) = [2, 3]);
    # heads 0 and 2 (⌊k·4/2⌋)
    assert names[:5] == ["velocity/l2", "drift/l2", "drift/l3", "attention_stability", "answer_line"]
    assert names[5:] == [f"head_mass/s{s}/h{h}/{c}" for s in (2, 3) for h in (0, 2) for c in ("prompt", "cue", "cot")]
    assert len(idx) == len(tgt.names())
    with pytest.raises(SiftError, match="cannot map"):
        channel_map(src, ChannelLayout(2, 2, 2, False))
