"""ICE white-box extractors on a tiny randomly initialised GPT-2 (no downloads)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from transformers.models.gpt2 import GPT2Config, GPT2LMHeadModel  # noqa: E402

from sift.companion import ice  # noqa: E402


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=64,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg).double().eval()


class ToyTokenizer:
    """Character-level stand-in: one id per character (mod 50)."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 50 for c in text]


IDS = [5, 17, 3, 44, 9, 12, 30]


def test_attention_attribution(model):
    before = model.config._attn_implementation
    a = ice.attention_attribution(model, IDS)
    assert model.config._attn_implementation == before  # restored after the eager call
    assert a.shape == (7,) and a.sum() == pytest.approx(1.0, abs=1e-12)
    assert (a >= 0).all()
    assert ice.attention_attribution(model, [7]).tolist() == [1.0]  # one token attends only to itself
    # Same numbers as a direct eager forward pass.
    model.set_attn_implementation("eager")
    with torch.no_grad():
        att = model(torch.tensor([IDS]), output_attentions=True).attentions
    ref = torch.stack([x[0, :, -1, :] for x in att]).mean((0, 1)).numpy()
    np.testing.assert_allclose(a, ref, atol=1e-12)


def test_gradient_x_input_completeness(model):
    target = 11
    gxi = ice.gradient_attribution(model, IDS, target, "grad_x_input")
    # Σ g·e is the directional derivative of the logit along the embeddings themselves.
    emb = model.get_input_embeddings()(torch.tensor([IDS])).detach()
    h = 1e-6
    with torch.no_grad():
        up = model(inputs_embeds=emb * (1 + h)).logits[0, -1, target]
        dn = model(inputs_embeds=emb * (1 - h)).logits[0, -1, target]
    assert gxi.sum() == pytest.approx(float((up - dn) / (2 * h)), rel=1e-6)
    gn = ice.gradient_attribution(model, IDS, target, "grad_norm")
    gxin = ice.gradient_attribution(model, IDS, target, "grad_x_input_norm")
    e = emb.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(model(inputs_embeds=e).logits[0, -1, target], e)
    np.testing.assert_allclose(gn, g[0].norm(dim=-1).numpy(), rtol=1e-12)
    np.testing.assert_allclose(gxin, (g[0] * emb[0]).norm(dim=-1).numpy(), rtol=1e-12)
    assert not np.allclose(gxi, ice.gradient_attribution(model, IDS, 0, "grad_x_input"))  # label id matters


def test_label_score_fn_and_ice_end_to_end(model):
    labels = [20, 21]
    fn = ice.make_label_score_fn(model, labels, prefix_ids=[1, 2], suffix_ids=[3])
    p = ice.label_probabilities(model, [1, 2] + IDS + [3], labels)
    assert p.sum() == pytest.approx(1.0)
    assert fn(IDS) == pytest.approx(p.max())  # predicted class fixed on the full input
    assert fn([]) == pytest.approx(ice.label_probabilities(model, [1, 2, 3], labels)[int(p.argmax())])
    attr = ice.gradient_attribution(model, [1, 2] + IDS + [3], labels[int(p.argmax())])[2:-1]
    res = ice.ice_example(IDS, attr, ice.batched(fn), {"delete": ice.delete}, n_null=None)["delete"]
    assert res.q == 1 and res.n_unique_null_sets == 7
    assert res.stats.n_null == 7 and np.isnan(res.stats.win_rate)  # 7 < min_valid=10 → NaN stats
    res = ice.ice_example(IDS, attr, ice.batched(fn), {"delete": ice.delete}, n_null=None, min_valid=1)["delete"]
    expected = np.mean([fn([IDS[int(np.argmax(attr))]]) > fn([t]) for t in IDS])
    assert res.stats.win_rate == pytest.approx(expected)


def test_step_attribution(model):
    tok = ToyTokenizer()
    steps = ["ab", "cde", "f"]
    enc = ice.encode_steps(tok, steps, prefix="Q:", suffix="A")
    assert enc.spans == ((2, 5), (5, 9), (9, 11))
    assert len(enc.input_ids) == 12
    s = ice.step_attribution(model, tok, steps, prefix="Q:", suffix="A")
    full = ice.attention_attribution(model, list(enc.input_ids))
    np.testing.assert_allclose(s, [full[2:5].sum(), full[5:9].sum(), full[9:11].sum()])
    g = ice.step_attribution(model, tok, steps, method="grad_x_input", target_token_id=4, reduce="mean")
    assert g.shape == (3,)
    assert ice.pool_step_scores([1, 2, 3, 4], [(0, 2), (2, 4), (4, 4)], "max").tolist() == [2.0, 4.0, 0.0]
    assert ice.label_token_ids(tok, [" pos", " neg"]) == [32 % 50, 32 % 50]
