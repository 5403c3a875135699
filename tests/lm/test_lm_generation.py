"""Generation on tiny random HF models loaded through load_causal_lm: chat templates, padding, seeds."""

import pytest

from sift.lm.generation import generate_ids
from sift.lm.items import LMItem
from sift.lm.loading import load_causal_lm
from sift.lm.prompts import LMView, encode_prompt, prompt_ids, prompt_text

ITEM = LMItem("t-0", "test", "Calculate 5 - 3 - 6.", "-4", "numeric")


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def lm(request, tiny_dirs):
    model, tok = load_causal_lm(str(tiny_dirs[request.param]))
    return request.param, model, tok


def _prompts(tok):
    views = [LMView(), LMView(template=1, budget="verbose"), LMView(cue_value="3", cue_format="professor"),
             LMView(template=3, cue_value="7", cue_format="metadata", explain=True)]
    return [prompt_ids(tok, ITEM, v) for v in views]


def test_chat_template_where_the_model_has_one(lm):
    arch, _, tok = lm
    text = prompt_text(tok, "What is 2+3?")
    ids = encode_prompt(tok, "What is 2+3?")
    if arch == "llama":
        assert text.startswith("<|user|>What is 2+3?") and text.endswith("<|assistant|>")
        assert ids[0] == tok.convert_tokens_to_ids("<|user|>") and ids[-1] == tok.convert_tokens_to_ids("<|assistant|>")
    else:
        assert tok.chat_template is None and text.endswith("Reasoning:\n")
        assert tok.decode(ids) == text


def test_greedy_batch_equals_one_by_one(lm):
    _, model, tok = lm
    prompts = _prompts(tok)
    assert len({len(p) for p in prompts}) > 1  # different lengths: left padding matters
    kw = dict(pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, max_new_tokens=12)
    batched = generate_ids(model, prompts, batch_size=4, **kw)
    single = [generate_ids(model, [p], batch_size=1, **kw)[0] for p in prompts]
    assert [g.new_ids for g in batched] == [g.new_ids for g in single]
    assert [g.prompt_ids for g in batched] == prompts
    assert all(len(g.new_ids) > 0 for g in batched)


def test_sampling_is_seeded(lm):
    _, model, tok = lm
    prompts = _prompts(tok)
    kw = dict(pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, max_new_tokens=12, do_sample=True, batch_size=4)
    a = generate_ids(model, prompts, seeds=[3 + i for i in range(len(prompts))], **kw)
    b = generate_ids(model, prompts, seeds=[3 + i for i in range(len(prompts))], **kw)
    c = generate_ids(model, prompts, seeds=[100 + i for i in range(len(prompts))], **kw)
    assert [g.new_ids for g in a] == [g.new_ids for g in b]
    assert [g.new_ids for g in a] != [g.new_ids for g in c]
