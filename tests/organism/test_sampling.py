"""The organism's choice-point sampler: greedy where sure, seeded uniform draws at choice points."""

import torch

from sift.organism.sampling import nucleus, sample_choice_points, stream_uniform
from sift.trajectories.toy import toy_model, toy_tokenizer


def test_stream_uniform_is_deterministic_and_spread():
    xs = [stream_uniform("0:item-1", k) for k in range(2000)]
    assert xs == [stream_uniform("0:item-1", k) for k in range(2000)]
    assert all(0.0 <= x < 1.0 for x in xs)
    assert abs(sum(xs) / len(xs) - 0.5) < 0.03 and stream_uniform("1:item-1", 0) != xs[0]


def test_nucleus_by_hand():
    probs = torch.tensor([0.05, 0.5, 0.05, 0.4])
    assert nucleus(probs, 0.9).tolist() == [1, 3]  # 0.5 + 0.4 reaches 0.9; listed in vocabulary order
    assert nucleus(torch.tensor([0.01, 0.95, 0.04]), 0.9).tolist() == [1]
    assert nucleus(torch.tensor([0.3, 0.3, 0.4]), 0.9).tolist() == [0, 1, 2]


class _Coin(torch.nn.Module):
    """A fake causal LM: after the prompt it emits token 5 or 6 (50/50), then 7 (sure), then eos."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=True):
        from types import SimpleNamespace

        last = input_ids[:, -1]
        logits = torch.full((input_ids.shape[0], input_ids.shape[1], 10), -30.0)
        nxt = logits[:, -1]
        for i, t in enumerate(last.tolist()):
            if t in (5, 6):
                nxt[i, 7] = 0.0
            elif t == 7:
                nxt[i, 2] = 0.0  # eos
            else:
                nxt[i, 5] = nxt[i, 6] = 0.0
        return SimpleNamespace(logits=logits, cache=None)


def test_choice_points_follow_the_stream_not_the_batch():
    m = _Coin()
    prompts = [[1, 3], [1, 4, 4], [1, 3]]
    streams = ["s:a", "s:a", "s:b"]
    out = sample_choice_points(m, prompts, streams, pad_id=0, eos_id=2, max_new_tokens=5)
    for o, s in zip(out, streams):
        want = 5 if stream_uniform(f"{s}|5,6", 0) < 0.5 else 6  # keyed by the candidate set; 50/50 inverse CDF
        assert o == [want, 7]
    assert out[0] == out[1]  # one stream, one draw, whatever the prompt
    alone = sample_choice_points(m, [prompts[2]], [streams[2]], pad_id=0, eos_id=2, max_new_tokens=5)
    assert alone == [out[2]]
    draws = {tuple(sample_choice_points(m, [[1, 3]], [f"seed{k}"], pad_id=0, eos_id=2, max_new_tokens=5)[0])
             for k in range(40)}
    assert draws == {(5, 7), (6, 7)}  # both choices occur across seeds


def test_sampler_on_a_real_hf_model_is_reproducible():
    tok = toy_tokenizer()
    model = toy_model("llama", seed=1)
    prompts = [tok.convert_tokens_to_ids(["<bos>", "terse", "evaluate", "true", "and", "false", ".", "reason",
                                          ":"])] * 2
    a = sample_choice_points(model, prompts, ["x", "y"], pad_id=tok.pad_token_id, eos_id=tok.eos_token_id,
                             max_new_tokens=6)
    b = sample_choice_points(model, prompts, ["x", "y"], pad_id=tok.pad_token_id, eos_id=tok.eos_token_id,
                             max_new_tokens=6)
    assert a == b and all(len(r) == 6 for r in a)
