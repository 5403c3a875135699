"""One forward pass: block outputs (pre-norm last block), captured attention, padding invariance, any HF LM."""

import pytest
import torch

from sift.errors import SiftError
from sift.lm.states import capture, find_blocks, model_inputs, pack
from sift.trajectories.extract import ExtractConfig, Extractor
from sift.trajectories.toy import toy_model, toy_records, toy_tokenizer


@pytest.fixture(scope="module")
def records():
    return [r for r in toy_records(4, families=("gpt2",))][:10]


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def model(request):
    return toy_model(request.param)


def _qwen2_gqa():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(toy_tokenizer()), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=128)
    return Qwen2ForCausalLM(cfg).eval()


def _final_norm(m):
    return m.transformer.ln_f if hasattr(m, "transformer") else m.model.norm


@torch.no_grad()
def test_last_block_is_pre_norm_and_hidden_states_are_block_outputs(model, records):
    tok = toy_tokenizer()
    p = pack([r["prompt_ids"] + r["generated_ids"] for r in records], tok.pad_token_id, "left")
    outs = {}
    hooks = [b.register_forward_hook(lambda m, i, o, k=k: outs.__setitem__(k, o[0] if isinstance(o, tuple) else o))
             for k, b in enumerate(find_blocks(model))]
    hs = model(**model_inputs(model, p, "cpu"), output_hidden_states=True).hidden_states
    for h in hooks:
        h.remove()
    L = len(outs)
    keep = p.mask.bool()
    for k in range(L - 1):  # hidden_states[1:L] are the outputs of blocks 1..L-1
        assert torch.allclose(hs[k + 1][keep], outs[k][keep], atol=1e-6)
    assert not torch.allclose(hs[L][keep], outs[L - 1][keep], atol=1e-3)  # HF's last element is normed
    assert torch.allclose(_final_norm(model)(outs[L - 1])[keep], hs[L][keep], atol=1e-5)
    ex = Extractor(model, ExtractConfig(interventions=[]), tokenizer=tok)
    r = records[0]
    out = ex.extract([r])
    c0, c1 = r["cot_span"]
    P = len(r["prompt_ids"])
    solo = pack([r["prompt_ids"] + r["generated_ids"]], tok.pad_token_id)
    last = {}
    h = find_blocks(model)[-1].register_forward_hook(
        lambda m, i, o: last.__setitem__("h", o[0] if isinstance(o, tuple) else o))
    model(**model_inputs(model, solo, "cpu"))
    h.remove()
    want = last["h"][0, P + c0:P + c1].mean(0)
    assert torch.allclose(out["pooled"][0], want, atol=1e-5)  # pooled = mean pre-norm block-L state over the CoT


@torch.no_grad()
def test_captured_attention_equals_eager_output_attentions(model, records):
    tok = toy_tokenizer()
    p = pack([r["prompt_ids"] + r["generated_ids"] for r in records], tok.pad_token_id, "left")
    kw = model_inputs(model, p, "cpu")
    L = len(find_blocks(model))
    with capture(model, attention=[0, L - 1]) as cap:
        model(**kw)
    model.set_attn_implementation("eager")
    try:
        ref = model(**kw, output_attentions=True).attentions
    finally:
        model.set_attn_implementation("sdpa")
    keep = p.mask.bool()
    for layer in (0, L - 1):
        assert torch.allclose(cap.attention[layer][keep], ref[layer].mean(1)[keep], atol=1e-6)
    assert model.config._attn_implementation == "sdpa"  # restored after the capture
    model.set_attn_implementation("eager")  # a model already on eager attention is captured too
    try:
        with capture(model, attention=[L - 1]) as cap2:
            model(**kw)
    finally:
        model.set_attn_implementation("sdpa")
    assert torch.allclose(cap2.attention[L - 1][keep], ref[L - 1].mean(1)[keep], atol=1e-6)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_equals_unpadded(model, records, side):
    ex = Extractor(model, ExtractConfig(padding_side=side, t_max=8), tokenizer=toy_tokenizer())
    batched = ex.extract_many(records)
    single = [ex.extract_many([r]) for r in records]
    for k in ("desc", "final", "pooled", "scalars", "answer_logp", "profile", "n_bins", "n_tokens"):
        solo = torch.cat([s[k] for s in single])
        assert batched[k].shape == solo.shape, k
        assert torch.allclose(batched[k].float(), solo.float(), atol=2e-3 if k == "final" else 1e-5), k


def test_interface_and_eager_fallback_agree(records):
    m = toy_model("llama")
    a = Extractor(m, ExtractConfig(interventions=[]), tokenizer=toy_tokenizer()).extract(records)
    ex = Extractor(m, ExtractConfig(interventions=[]), tokenizer=toy_tokenizer())
    ex.use_interface = False
    b = ex.extract(records)
    assert torch.allclose(a["desc"], b["desc"], atol=1e-5)


def test_any_hf_causal_lm_with_grouped_query_attention(records):
    m = _qwen2_gqa()
    ex = Extractor(m, ExtractConfig(t_max=4), tokenizer=toy_tokenizer())
    out = ex.extract_many(records)
    assert ex.use_interface
    H = m.config.num_attention_heads
    assert ex.channels[:5] == ["velocity/l1", "drift/l1", "drift/l2", "attention_stability", "answer_line"]
    assert ex.channels[5:8] == ["head_mass/s1/h0/prompt", "head_mass/s1/h0/cue", "head_mass/s1/h0/cot"]
    assert len(ex.channels) == 5 + 2 * H * 3
    assert out["desc"].shape == (int(out["n_bins"].sum()), len(ex.channels))
    assert int((out["n_bins"] - out["n_answer"]).max()) <= 4  # the CoT's bins; the answer line's steps are extra
    p = pack([r["prompt_ids"] + r["generated_ids"] for r in records], 0, "left")
    kw = model_inputs(m, p, "cpu")
    with torch.no_grad(), capture(m, attention=[1]) as cap:
        m(**kw)
    m.set_attn_implementation("eager")
    with torch.no_grad():
        ref = m(**kw, output_attentions=True).attentions[1].mean(1)
    keep = p.mask.bool()
    assert torch.allclose(cap.attention[1][keep], ref[keep], atol=1e-6)


def test_nan_states_and_foreign_tokens_are_clear_errors(records):
    m = toy_model("gpt2")
    ex = Extractor(m, ExtractConfig(), tokenizer=toy_tokenizer(), name="checkpoints/x")
    bad = dict(records[0], generated_ids=records[0]["generated_ids"][:-1] + [10_000])
    with pytest.raises(SiftError, match="vocabulary size .* checkpoints/x"):
        ex.extract([bad])
    with torch.no_grad():
        find_blocks(m)[0].mlp.c_proj.weight.fill_(float("nan"))
    with pytest.raises(SiftError, match=r"checkpoints/x: non-finite hidden states for trace gpt2\|"):
        ex.extract(records[:2])


def test_empty_cot_and_binning_in_a_batch(records):
    ex = Extractor(toy_model("gpt2"), ExtractConfig(t_max=3), tokenizer=toy_tokenizer())
    empty = dict(records[0], cot_span=[0, 0], trace_id="empty")
    out = ex.extract_many([records[1], empty, records[2]])
    cot_bins = (out["n_bins"] - out["n_answer"]).tolist()  # the answer line's steps follow each CoT's bins
    assert cot_bins[1] == 0 and out["n_tokens"].tolist()[1] == 0 and out["n_answer"].tolist()[1] > 0
    assert cot_bins[0] == 3 and out["desc"].shape[0] == int(out["n_bins"].sum())
    assert torch.all(out["pooled"][1] == 0) and torch.isfinite(out["scalars"]).all()


@torch.no_grad()
def test_capture_leaves_the_outputs_bit_identical_and_reads_block_outputs(model, records):
    """The capturing attention wraps the model's own kernel: logits and hidden states are unchanged, and the
    hooked block outputs are HF's hidden states (the last one before the final norm)."""
    tok = toy_tokenizer()
    p = pack([r["prompt_ids"] + r["generated_ids"] for r in records], tok.pad_token_id, "left")
    kw = model_inputs(model, p, "cpu")
    L = len(find_blocks(model))
    ref = model(**kw, output_hidden_states=True)
    with capture(model, blocks=range(L), attention=[L - 1], q_start=3, heads="all") as cap:
        out = model(**kw, output_hidden_states=True)
    assert torch.equal(out.logits, ref.logits)
    assert all(torch.equal(a, b) for a, b in zip(out.hidden_states, ref.hidden_states))
    assert all(torch.equal(cap.states[i], ref.hidden_states[i + 1]) for i in range(L - 1))
    assert cap.states[L - 1].shape == ref.hidden_states[-1].shape
    assert not torch.equal(cap.states[L - 1], ref.hidden_states[-1])  # HF's last element is after the final norm
    S = p.ids.shape[1]
    assert cap.attention[L - 1].shape == (len(records), model.config.num_attention_heads, S - 3, S)


@torch.no_grad()
def test_weights_only_recompute_is_the_eager_formula_bit_for_bit(model, records, monkeypatch):
    """The capture recomputes a layer's weights with the model's own eager formula but skips its weights × values
    product (whose result it discards) and builds the additive mask once per pass, not once per layer: the weights
    are bit-identical to the full formula's (issue 49: extraction's shards do not change by one bit)."""
    import contextlib

    from sift.lm import states

    tok = toy_tokenizer()
    p = pack([r["prompt_ids"] + r["generated_ids"] for r in records], tok.pad_token_id, "left")
    kw = model_inputs(model, p, "cpu")
    L = len(find_blocks(model))
    built = []
    real_mask = states._additive_mask
    monkeypatch.setattr(states, "_additive_mask", lambda *a: built.append(1) or real_mask(*a))
    with capture(model, attention=range(L), q_start=3, heads="all") as fast:
        model(**kw)
    assert len(built) == 1 and len(fast.masks) == 1  # one mask for every layer of the pass
    skipped = []
    real_mode = states._WeightsOnly.__torch_function__

    def spy(self, func, types, args=(), kwargs=None):
        if func in (torch.matmul, torch.Tensor.__matmul__) and len(args) == 2 and args[1] is self.value:
            skipped.append(func)
        return real_mode(self, func, types, args, kwargs)

    monkeypatch.setattr(states._WeightsOnly, "__torch_function__", spy)
    with capture(model, attention=range(L), q_start=3, heads="all"):
        model(**kw)
    assert len(skipped) == L  # the product skipped in every layer: no other matmul was touched
    monkeypatch.setattr(states, "_WeightsOnly", lambda value: contextlib.nullcontext())
    with capture(model, attention=range(L), q_start=3, heads="all") as full:
        model(**kw)
    for layer in range(L):
        assert torch.equal(fast.attention[layer], full.attention[layer])
