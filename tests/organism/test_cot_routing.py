"""The ``cot_routing`` mechanism kind: a latent-gated query adapter acting at CoT positions only (toy models, hand
computations), its training penalty (analytic cases), and the shipped cot_routing organism's causal checks."""

from __future__ import annotations

import random

import pytest
import torch

from sift.errors import SiftError
from sift.lm.adapter import ADAPTER_FILE, QueryAdapter, load_adapter, query_modules
from sift.lm.latent import adapter_of, attach_adapter, attach_direction, has_latent, injected, kind_folder
from sift.lm.states import capture
from sift.trajectories.toy import toy_model

ANSWER = 9  # the toy vocabulary's stand-in for the organism's ``answer`` word


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def adapted(request):
    torch.manual_seed(0)
    m = toy_model(request.param, seed=5).eval()
    cfg = m.config
    ad = QueryAdapter(cfg.hidden_size, cfg.num_attention_heads, (0, 1), (1,), rank=2)
    with torch.no_grad():
        ad.B.normal_(0, 1.0)
    attach_adapter(m, ad, ANSWER)
    return m


def _run(model, ids, value, start, kind="cot_routing"):
    with torch.no_grad(), injected(model, [value], [start], kind=kind), capture(model, blocks=range(2)) as cap:
        logits = model(input_ids=torch.tensor([ids])).logits
    return [cap.states[i][0] for i in range(2)], logits[0]


def test_the_adapter_acts_at_cot_positions_only(adapted):
    """The prompt's states are bit-identical under both latents and without one; the CoT's differ; at the answer line
    the adapter is off, so a difference there can only come from what the CoT's states hold (its keys/values)."""
    ids, start = [1, 5, 6, 7, 8, ANSWER, 10, 11], 3
    a = ids.index(ANSWER)
    (hp, lp), (hm, lm) = _run(adapted, ids, 1.0, start), _run(adapted, ids, -1.0, start)
    (h0, _) = _run(adapted, ids, 0.0, start)
    for x, y, z in zip(hp, hm, h0):
        assert torch.equal(x[:start], y[:start]) and torch.equal(x[:start], z[:start])
        assert (x[start:a] - y[start:a]).abs().amax(-1).min() > 1e-4
    assert torch.equal(lp[:start], lm[:start]) and not torch.allclose(lp[start:a], lm[start:a])


def test_the_adapter_is_the_hand_computed_query_delta(adapted):
    """With the gate on at one position, the first adapted layer's query projection output there is the plain one plus
    z · (x A) B on the adapted head's columns only, and unchanged elsewhere."""
    ad = adapter_of(adapted)
    mod = query_modules(adapted, ad.layers)[0]
    seen = []
    ids, start = [1, 5, 6, 7, 8], 4
    for z in (1.0, 0.0):
        with torch.no_grad(), injected(adapted, [z], [start], kind="cot_routing"):
            h = mod.register_forward_hook(lambda _m, inp, out: seen.append((inp[0], out)))  # after the adapter's
            adapted(input_ids=torch.tensor([ids]))
            h.remove()
    (x, on), (_, off) = seen
    W = adapted.config.hidden_size
    delta = on[..., :W] - off[..., :W]
    want = (x[0, start] @ ad.A[0]) @ ad.B[0] * ad.column_mask
    torch.testing.assert_close(delta[0, start], want, atol=1e-5, rtol=1e-4)
    assert float(delta[0, :start].abs().max()) == 0.0
    assert float(delta[0, start][ad.column_mask == 0].abs().max()) == 0.0
    if on.shape[-1] > W:  # gpt2's fused projection: keys and values untouched
        assert torch.equal(on[..., W:], off[..., W:])


def test_cached_generation_switches_the_adapter_off_at_the_answer_line(adapted):
    """Cached decoding, one token at a time, equals the full forward pass: the answer word seen in an earlier cached
    step keeps the adapter off for every later one."""
    from sift.lm.generation import cache_arg, cache_of

    seq, start = [1, 5, 6, 7, 8, ANSWER, 10, 11, 12], 3
    for v in (1.0, -1.0):
        with torch.no_grad(), injected(adapted, [v], [start], kind="cot_routing"):
            full = adapted(input_ids=torch.tensor([seq])).logits[0]
            res = adapted(input_ids=torch.tensor([seq[:4]]), use_cache=True)
            steps = [res.logits[0, -1]]
            for t in range(4, len(seq)):
                res = adapted(input_ids=torch.tensor([[seq[t]]]), position_ids=torch.tensor([[t]]), use_cache=True,
                              attention_mask=torch.ones(1, t + 1, dtype=torch.long),
                              **{cache_arg(adapted): cache_of(res)})
                steps.append(res.logits[0, -1])
        torch.testing.assert_close(torch.stack(steps), full[3:], atol=1e-5, rtol=1e-4)


def test_kinds_refuse_weights_of_the_other_kind(adapted):
    """cot_routing weights have no residual direction and v3 weights no adapter: running one as the other is refused
    by name; a real LM (neither) ignores latents."""
    assert has_latent(adapted)
    with pytest.raises(SiftError, match="no latent direction"), injected(adapted, [1.0], [1], kind="offset"):
        pass
    plain = toy_model("gpt2", seed=5)
    attach_direction(plain, torch.randn(plain.config.hidden_size), answer_id=ANSWER)
    with pytest.raises(SiftError, match="no query adapter"), injected(plain, [1.0], [1], kind="cot_routing"):
        pass
    real = toy_model("gpt2", seed=5)
    assert not has_latent(real)
    with injected(real, [1.0], [1], kind="cot_routing"):
        pass
    assert kind_folder("/w", "gpt2", "cot_routing").as_posix() == "/w/cot_routing/gpt2"
    assert kind_folder("/w", "gpt2", "answer_routing").as_posix() == "/w/gpt2"


def test_adapter_round_trips_and_malformed_files_are_named(tmp_path, adapted):
    ad = adapter_of(adapted)
    ad.save(tmp_path)
    back = load_adapter(tmp_path, adapted.config.num_attention_heads)
    assert back.layers == ad.layers and back.heads == ad.heads
    assert torch.equal(back.A, ad.A.detach()) and torch.equal(back.B, ad.B.detach())
    assert load_adapter(tmp_path / "none", 4) is None
    from safetensors.torch import save_file

    save_file({"A": torch.zeros(2, 8, 2), "B": torch.zeros(2, 3, 8), "layers": torch.tensor([0, 1]),
               "heads": torch.tensor([0])}, str(tmp_path / ADAPTER_FILE))
    with pytest.raises(SiftError, match=r"mechanism_adapter.safetensors: A \(2, 8, 2\) and B \(2, 3, 8\)"):
        load_adapter(tmp_path, 4)
    with pytest.raises(SiftError, match="outside 0..3"):
        QueryAdapter(8, 4, (0,), (4,))


# ------------------------------------------------------------------------------------------ the training penalty

def _batch(d: torch.Tensor, starts, answers):
    """Twin rows 2i (z=+1) and 2i+1 (z=−1) of width T whose states differ by ``d[i]`` ([P, T, W])."""
    P, T, W = d.shape
    base = torch.randn(P, T, W)
    h = torch.stack([base + d, base], 1).reshape(2 * P, T, W)
    batch = {"input_ids": torch.zeros(2 * P, T, dtype=torch.long),
             "latent": torch.tensor([1.0, -1.0] * P),
             "latent_start": torch.tensor([s for s in starts for _ in range(2)]),
             "answer_pos": torch.tensor([a for a in answers for _ in range(2)])}
    return (h, h), batch  # hidden[0] (the embeddings) is skipped by the penalty


def test_cot_part_masks_by_hand():
    from sift.organism.train import cot_part_masks

    m = cot_part_masks(torch.tensor([2]), torch.tensor([8]), 10)[0]  # CoT = positions 2..7 (6 tokens)
    assert m[:, 0].nonzero().flatten().tolist() == [2, 3]
    assert m[:, 1].nonzero().flatten().tolist() == [4, 5]
    assert m[:, 2].nonzero().flatten().tolist() == [6, 7]
    assert m[:, 3].nonzero().flatten().tolist() == [7]
    assert m[:, 4].nonzero().flatten().tolist() == [2, 3, 4, 5, 6, 7]


def test_class_mean_penalty_is_the_unbiased_squared_mean_difference():
    """A static offset c at every CoT position: every part's pooled difference is c, so each of the 5 parts gives
    exactly ‖c‖² / scale; zero-mean differences (+u for half the pairs, −u for the other half) give a negative
    unbiased estimate, −‖u‖²/(n−1) per part, not 0: the estimator has no positive bias from the spread."""
    from sift.organism.train import N_COT_PARTS, class_mean_penalty

    torch.manual_seed(0)
    P, T, W = 6, 9, 4
    c = torch.tensor([1.0, -2.0, 0.5, 0.0])
    d = torch.zeros(P, T, W)
    d[:, 2:8] = c
    hidden, batch = _batch(d, [2] * P, [8] * P)
    mask = torch.zeros(2 * P, T, dtype=torch.bool)
    mask[:, 2:8] = True
    scale = (hidden[1] ** 2).sum(-1)[mask].mean()
    got = class_mean_penalty(hidden, batch)
    torch.testing.assert_close(got, N_COT_PARTS * c.pow(2).sum() / scale)
    u = torch.tensor([0.0, 3.0, 0.0, 4.0])
    d = torch.zeros(P, T, W)
    d[: P // 2, 2:8] = u
    d[P // 2:, 2:8] = -u
    hidden, batch = _batch(d, [2] * P, [8] * P)
    scale = (hidden[1] ** 2).sum(-1)[mask].mean()
    torch.testing.assert_close(class_mean_penalty(hidden, batch), -N_COT_PARTS * u.pow(2).sum() / (P - 1) / scale)
    bad = dict(batch, latent=torch.tensor([1.0, 1.0] * P))
    with pytest.raises(SiftError, match="twins under opposite latents"):
        class_mean_penalty(hidden, bad)


def test_twin_draws_share_every_token_but_a_drill_answer():
    from sift.organism.mixture import MixtureConfig, sample_example, sample_twins

    rng, mix = random.Random(3), MixtureConfig(p_edit=0.3, p_swap=0.3, p_truncate=0.2)
    differ = 0
    for _ in range(200):
        a, b = sample_twins(rng, mix)
        assert (a.mechanism, b.mechanism) == (1, 0) and a.prompt == b.prompt and a.kind == b.kind
        assert a.completion[:-1] == b.completion[:-1]
        if a.kind == "natural":
            assert a.completion == b.completion
        differ += a.completion[-1] != b.completion[-1]
    assert differ > 20  # drills: the two mechanisms answer differently
    s1, s2 = random.Random(7), random.Random(7)
    assert sample_example(s1, mix, mechanism=0).prompt == sample_example(s2, mix, mechanism=1).prompt


# ------------------------------------------------------------------------------------------ the shipped organism

@pytest.fixture(scope="module")
def shipped():
    from sift.lm.loading import load_causal_lm
    from sift.organism import DEFAULT_CHECKPOINTS

    folder = kind_folder(DEFAULT_CHECKPOINTS, "gpt2", "cot_routing")
    model, tok = load_causal_lm(str(folder))
    return model, tok


@pytest.fixture(scope="module")
def card(shipped):
    from sift.organism.mechanism import mechanism_card

    model, tok = shipped
    return mechanism_card(model, tok, "cot_routing", "gpt2", n_per_cell=6)


def test_shipped_cot_routing_is_loaded_with_its_adapter_and_no_direction(shipped):
    from sift.lm.latent import direction_of

    model, _ = shipped
    assert adapter_of(model) is not None and direction_of(model) is None


def test_cot_routing_causal_checks(card):
    """The latent decides the answer; knocking the adapter out collapses both latents into one model, which agrees with
    the latent's mechanism at chance (half of the probes are under each latent); patching
    the adapted heads' CoT outputs from z=+1 into z=−1 flips the answer to the CoT's edit, patching as many other
    heads does not; the answer line reads z, the CoT's pooled states hardly do (no static direction)."""
    a = card.adapter
    assert a["z=+1"]["as the z=+1 mechanism"] >= 0.95 and a["z=-1"]["as the z=−1 mechanism"] >= 0.95
    ko = a["adapter knocked out (either z)"]  # one model for both latents: agreement with the latent is chance
    assert (ko["as the z=+1 mechanism"] + ko["as the z=−1 mechanism"]) / 2 <= 0.6
    assert a["patch the adapted heads at CoT positions, z=+1 → z=−1"]["answers CoT edit"] >= 0.9
    assert a["patch as many un-adapted heads (control)"]["answers CoT edit"] <= 0.1
    assert card.onset["as cot_routing"] >= 0.95
    assert min(card.linear["answer position"][2:]) >= 0.8  # ~50 probes here (the shipped card: 0.97-0.99)
    assert max(card.linear["CoT mean"]) <= 0.75 and max(card.linear["last CoT token"]) <= 0.75
