"""The mechanism latent (organism v3): injected where it should be, replayed exactly, and never in the prompt."""

import pytest
import torch

from sift.errors import SiftError
from sift.lm.generation import left_padded
from sift.lm.states import capture
from sift.organism.latent import (
    attach_direction,
    direction_of,
    draw_mechanism,
    injected,
    latent_value,
    load_direction,
    record_latent,
    replay,
    save_direction,
)
from sift.organism.sampling import sample_choice_points
from sift.trajectories.toy import toy_model, toy_tokenizer


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = toy_model("llama", seed=3)
    attach_direction(m, torch.randn(m.config.hidden_size))
    return m.eval()


def _states(model, ids, value, start):
    with torch.no_grad(), injected(model, [value], [start]), capture(model, blocks=range(2)) as cap:
        logits = model(input_ids=torch.tensor([ids])).logits
    return [cap.states[i][0] for i in range(2)], logits[0]


def test_prompt_states_never_see_the_latent_and_cot_states_do(model):
    ids, start = [1, 5, 6, 7, 8, 9, 10, 11], 5
    (h_plus, l_plus), (h_minus, l_minus) = _states(model, ids, 1.0, start), _states(model, ids, -1.0, start)
    for a, b in zip(h_plus, h_minus):
        assert torch.equal(a[:start], b[:start])  # bit-identical before the first CoT position (causal)
        assert (a[start:] - b[start:]).abs().amax(-1).min() > 1e-3  # every CoT position carries it
    # the first CoT token is predicted at the last prompt position: identical logits under both mechanisms
    assert torch.equal(l_plus[start - 1], l_minus[start - 1])
    assert not torch.allclose(l_plus[start], l_minus[start])


def test_injection_is_the_direction_added_to_the_embedding(model):
    ids = torch.tensor([[1, 5, 6, 7]])
    emb = model.get_input_embeddings()(ids)
    d = direction_of(model)
    want = emb.clone()
    want[0, 2:] += -1.0 * d
    with torch.no_grad():
        ref = model(inputs_embeds=want).logits
        with injected(model, [-1.0], [2]):
            got = model(input_ids=ids).logits
            by_embeds = model(inputs_embeds=emb).logits  # embeddings given directly: the latent is added there
    assert torch.allclose(got, ref, atol=1e-5) and torch.allclose(by_embeds, ref, atol=1e-5)


def test_left_padding_and_kv_cache_replay_the_same_latent(model):
    """A left-padded batch, and generation with a KV cache, give what an unpadded full forward gives."""
    prompts = [[1, 5, 6, 7], [1, 8, 9, 10, 11, 12]]
    vals = [1.0, -1.0]
    new = sample_choice_points(model, prompts, ["a", "b"], pad_id=0, eos_id=2, max_new_tokens=6, latents=vals,
                               top_p=None)
    for p, v, g in zip(prompts, vals, new):
        seq = list(p)
        for t in g:  # greedy re-decode one token at a time, full forward, no padding, no cache
            with torch.no_grad(), injected(model, [v], [len(p)]):
                nxt = int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
            assert nxt == t
            seq.append(t)
    ids, mask, pos = left_padded([p + g for p, g in zip(prompts, new)], 0)
    with torch.no_grad(), injected(model, vals, [len(p) for p in prompts]):
        batched = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
    for i, (p, g) in enumerate(zip(prompts, new)):
        with torch.no_grad(), injected(model, [vals[i]], [len(p)]):
            alone = model(input_ids=torch.tensor([p + g])).logits[0, -1]
        assert torch.allclose(batched[i], alone, atol=1e-4)


def test_replay_reads_the_record_and_refuses_mixed_batches(model):
    recs = [{"trace_id": "t1", "prompt_ids": [1, 5, 6], "cot_span": [0, 2], "latent": record_latent(0)},
            {"trace_id": "t2", "prompt_ids": [1, 5], "cot_span": [0, 2], "latent": record_latent(1)}]
    ids = torch.tensor([[1, 5, 6, 7, 8], [1, 5, 6, 7, 8]])
    with torch.no_grad(), replay(model, recs):
        got = model(input_ids=ids).logits
    with torch.no_grad(), injected(model, [-1.0, 1.0], [3, 2]):
        want = model(input_ids=ids).logits
    assert torch.equal(got, want)
    with pytest.raises(SiftError, match="carry no 'latent'"), replay(model, [recs[0], {"trace_id": "old",
                                                                                      "prompt_ids": [1]}]):
        pass
    with pytest.raises(SiftError, match="batch of 2 rows but 1 latent"), torch.no_grad(), \
            injected(model, [1.0], [2]):
        model(input_ids=ids)


def test_a_model_without_a_direction_ignores_latents():
    m = toy_model("gpt2", seed=1).eval()
    ids = torch.tensor([[1, 5, 6, 7]])
    with torch.no_grad():
        plain = m(input_ids=ids).logits
        with injected(m, [1.0], [1]):
            assert torch.equal(m(input_ids=ids).logits, plain)


def test_direction_round_trips_and_is_refused_at_the_wrong_width(tmp_path, model):
    save_direction(tmp_path, direction_of(model))
    assert torch.equal(load_direction(tmp_path), direction_of(model).float())
    assert load_direction(tmp_path / "none") is None
    with pytest.raises(SiftError, match="width is"):
        attach_direction(model, torch.zeros(3))


def test_mechanism_draws_are_deterministic_and_balanced():
    draws = [draw_mechanism(f"0:item-{i}") for i in range(2000)]
    assert draws == [draw_mechanism(f"0:item-{i}") for i in range(2000)]
    assert 0.45 <= sum(draws) / len(draws) <= 0.55
    # another sampling seed draws anew: about half of the items change mechanism
    other = [draw_mechanism(f"1:item-{i}") for i in range(2000)]
    assert 0.4 <= sum(a != b for a, b in zip(draws, other)) / 2000 <= 0.6
    assert latent_value(1) == 1.0 and latent_value(0) == -1.0
    with pytest.raises(SiftError):
        latent_value(2)


def test_training_batches_inject_from_the_first_completion_token():
    from sift.organism.mixture import Example
    from sift.organism.train import encode

    tok = toy_tokenizer()
    vocab = [w for w in tok.get_vocab() if not w.startswith("<")]
    ex = [Example(vocab[:3], vocab[3:6] + ["answer", ":", "5"], "arithmetic", "natural", 0),
          Example(vocab[:5], vocab[3:5] + ["answer", ":", "5"], "arithmetic", "edit", 1)]
    b = encode(ex, tok, 3.0)
    assert b["latent"].tolist() == [-1.0, 1.0]
    assert b["latent_start"].tolist() == [4, 6]  # bos + prompt
    assert b["input_ids"][0, 4] == tok.convert_tokens_to_ids(vocab[3])


# ------------------------------------------------------------------------------------------ mechanism kinds
ANSWER = 9  # the toy vocabulary's stand-in for the organism's ``answer`` word


@pytest.fixture(scope="module")
def routed():
    torch.manual_seed(0)
    m = toy_model("gpt2", seed=5)
    attach_direction(m, torch.randn(m.config.hidden_size), answer_id=ANSWER)
    return m.eval()


def _run(model, ids, value, start, kind):
    with torch.no_grad(), injected(model, [value], [start], kind=kind), capture(model, blocks=range(2)) as cap:
        logits = model(input_ids=torch.tensor([ids])).logits
    return [cap.states[i][0] for i in range(2)], logits[0]


def test_answer_routing_leaves_prompt_and_cot_states_bit_identical(routed):
    """Under answer_routing the latent enters at the first answer-line token after the CoT start: every state before
    it is bit-identical under both latents, every state from it on differs; under offset the CoT differs too."""
    ids, start = [1, 5, 6, 7, 8, ANSWER, 10, 11], 3  # the prompt [1, 5, 6], the CoT 7 8, the answer line 9 10 11
    a = ids.index(ANSWER)
    (hp, lp), (hm, lm) = _run(routed, ids, 1.0, start, "answer_routing"), _run(routed, ids, -1.0, start,
                                                                               "answer_routing")
    for x, y in zip(hp, hm):
        assert torch.equal(x[:a], y[:a])
        assert (x[a:] - y[a:]).abs().amax(-1).min() > 1e-3
    assert torch.equal(lp[:a], lm[:a]) and not torch.allclose(lp[a], lm[a])
    (op, _), (om, _) = _run(routed, ids, 1.0, start, "offset"), _run(routed, ids, -1.0, start, "offset")
    assert (op[0][start:a] - om[0][start:a]).abs().amax(-1).min() > 1e-3
    # an answer word in the prompt (before the CoT start) switches nothing on
    early = [1, ANSWER, 6, 7, 8, 10]
    (hp, _), (hm, _) = _run(routed, early, 1.0, 3, "answer_routing"), _run(routed, early, -1.0, 3, "answer_routing")
    assert torch.equal(hp[1], hm[1])


def test_answer_routing_replays_the_same_under_a_kv_cache_and_from_records(routed):
    """Generation (KV cache: the switch is remembered across steps) and a full forward give the same tokens; replay
    reads the kind from the record; a batch mixing kinds is refused."""
    prompts = [[1, 5, 6], [1, 8, 11, 12]]
    vals = [1.0, -1.0]
    new = sample_choice_points(routed, prompts, ["a", "b"], pad_id=0, eos_id=2, max_new_tokens=8, latents=vals,
                               top_p=None, kind="answer_routing")
    for p, v, g in zip(prompts, vals, new):
        seq = list(p)
        for t in g:
            with torch.no_grad(), injected(routed, [v], [len(p)], kind="answer_routing"):
                assert int(routed(input_ids=torch.tensor([seq])).logits[0, -1].argmax()) == t
            seq.append(t)
    forced = [1, 5, 6, 7, ANSWER, 8, 10]
    recs = [{"trace_id": "t", "prompt_ids": [1, 5, 6], "cot_span": [0, 1], "latent": record_latent(0),
             "mechanism_kind": "answer_routing"}]
    with torch.no_grad(), replay(routed, recs):
        got = routed(input_ids=torch.tensor([forced])).logits
    with torch.no_grad(), injected(routed, [-1.0], [3], kind="answer_routing"):
        want = routed(input_ids=torch.tensor([forced])).logits
    assert torch.equal(got, want)
    with pytest.raises(SiftError, match="mixes mechanism kinds"), replay(routed, recs + [{**recs[0],
                                                                                       "mechanism_kind": "offset"}]):
        pass
    with pytest.raises(SiftError, match="mechanism_kind 'sideways' is not one of offset, answer_routing"):
        with injected(routed, [1.0], [1], kind="sideways"):
            pass


def test_answer_routing_remembers_the_switch_across_cached_steps(routed):
    """The answer word fed in one cached step switches the latent on for every later cached step."""
    from sift.lm.generation import cache_arg, cache_of

    seq, start = [1, 5, 6, 7, 8, ANSWER, 10, 11, 12], 3
    for v in (1.0, -1.0):
        with torch.no_grad(), injected(routed, [v], [start], kind="answer_routing"):
            full = routed(input_ids=torch.tensor([seq])).logits[0]
            res = routed(input_ids=torch.tensor([seq[:4]]), use_cache=True)
            steps = [res.logits[0, -1]]
            for t in range(4, len(seq)):
                res = routed(input_ids=torch.tensor([[seq[t]]]), position_ids=torch.tensor([[t]]), use_cache=True,
                             attention_mask=torch.ones(1, t + 1, dtype=torch.long),
                             **{cache_arg(routed): cache_of(res)})
                steps.append(res.logits[0, -1])
        torch.testing.assert_close(torch.stack(steps), full[3:], atol=1e-5, rtol=1e-4)
