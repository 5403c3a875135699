"""The judge runner: a label-following stand-in judge gives analytic anchoring numbers; a tiny random HF judge
runs the real scoring path (no downloads)."""

import math
import re

import numpy as np
import pytest

from sift.companion import judges as J
from sift.companion.judge_run import HFJudge, organism_pairs, run_judges


class LabelFollower:
    """Ranks first whichever displayed answer carries 'LLM' (in the last user turn); Tie without labels."""

    verdict_mode = "stub"
    chat = False

    def judge(self, turns, order):
        last = turns[-1]
        m = re.search(r"Answer 1 = (\w+)", last)
        if m:
            shown = J.ONE_FIRST if m.group(1) == "LLM" else J.TWO_FIRST
        elif "Answer 1 (label = LLM)" in last:
            shown = J.ONE_FIRST
        elif "Answer 2 (label = LLM)" in last:
            shown = J.TWO_FIRST
        else:
            shown = J.TIE
        return J.map_display_verdict(shown, order), "Answer 1 reads better as the LLM one.", True


def test_organism_pairs_are_equal_content():
    items = organism_pairs(6, seed=3)
    assert len({i.item_id for i in items}) == 6
    for it in items:
        ans = re.findall(r"\d+", it.candidates[0])[-1]
        assert re.findall(r"\d+", it.candidates[1])[-1] == ans  # both explanations reach the same answer
        assert it.true_labels == ("LLM", "TradML")


def test_label_follower_anchoring_is_analytic():
    r = run_judges(LabelFollower(), organism_pairs(8), n_resamples=50, progress=False)
    assert r["blind"]["edr"] == 1.0 and r["blind"]["nd"] == 0.0
    p = r["probes"]
    for probe in ("truth", "flip"):  # every verdict moves from Tie to the label-favoured outcome
        assert (p[probe]["lds"], p[probe]["ts"], p[probe]["ols"], p[probe]["lao"]) == (1.0, 0.0, 0.0, 1.0)
    assert p["truth"]["counts"] == [0.0, 1.0, 0.0] and p["flip"]["counts"] == [0.0, 0.0, 1.0]
    assert p["placebo"]["tv"] == 0.0 and math.isnan(p["placebo"]["lao"])  # a badge is not 'LLM'
    assert p["verbosity"]["tv"] == 0.0 and p["confidence"]["cue_align"] == 0.0
    assert p["reveal_after"]["rs"] == 1.0  # the flip-stage verdict is revised after the reveal, every time
    assert math.isnan(p["truth"]["drift"]) and p["truth"]["n_same"] == 0  # no same-decision item
    assert p["placebo"]["drift"] == 0.0 and p["placebo"]["n_same"] == 8  # identical explanations
    assert np.asarray(p["truth"]["transition"]).sum() == 8


@pytest.fixture(scope="module")
def tiny_judge():
    torch = pytest.importorskip("torch")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = sorted({w for it in organism_pairs(4) for t in (it.question, *it.candidates) for w in t.split()}
                   | set('{"verdict": "[1,2]" "[2,1]" "Tie" "explanation": } Answer Question label LLM TradML'.split()))
    vocab = {w: i for i, w in enumerate(["<unk>", "<eos>"] + words)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>")
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                                     eos_token_id=1, pad_token_id=1, bos_token_id=1)).eval()
    return m, tok


def test_tiny_hf_judge_end_to_end(tiny_judge):
    m, tok = tiny_judge
    j = HFJudge(m, tok, chat=False, max_explanation_tokens=3)
    lp = j.verdict_logprobs(["Which is better?"])
    assert lp.shape == (3,) and np.all(lp < 0)
    before = j.n_calls
    r = run_judges(j, organism_pairs(3), probes=["blind", "truth", "flip", "reveal_after"], n_resamples=20,
                   progress=False)
    assert r["n_items"] == 3 and set(r["probes"]) == {"truth", "flip", "reveal_after"}
    for d in r["probes"].values():
        assert d["tv"] == pytest.approx(d["lds"] + d["ts"] + d["ols"])
    assert j.n_calls - before == 3 * 5  # one scoring pass per prompt (Reveal-After has two turns)


def test_add_a_judge_probe(monkeypatch):
    """A new condition is one registered Probe: run_judges asks it and the summary applies its flags."""
    from sift.companion import judge_run as R

    monkeypatch.setattr(R, "PROBE_REGISTRY", dict(R.PROBE_REGISTRY))

    def both_llm(ctx):  # both answers carry the favoured label: a label-following judge stays at Tie
        it = ctx.item
        prompt = J.truth_prompt(it.question, it.candidates, ("LLM", "LLM"), **ctx.prompt_kw)
        return R.ProbeCall(prompt, J.ONE_FIRST, ("LLM", "LLM"), {"note": "both"})

    R.register_probe(R.Probe("both_llm", both_llm, label_aligned=True))
    with pytest.raises(Exception, match="already registered"):
        R.register_probe(R.Probe("both_llm", both_llm))
    r = run_judges(LabelFollower(), organism_pairs(6), probes=["blind", "both_llm"], n_resamples=20, progress=False)
    d = r["probes"]["both_llm"]
    recs = r["records"]["both_llm"]  # "Answer 1 = LLM" in the prompt: the follower ranks displayed Answer 1 first
    assert [rec["verdict"] for rec in recs] == [J.ONE_FIRST if rec["display_order"][0] == 0 else J.TWO_FIRST
                                                for rec in recs]
    assert d["counts"][0] == 0.0  # never a Tie
    assert "lai" in d and "cue_align" not in d and "rs" not in d
    assert [rec["note"] for rec in recs] == ["both"] * 6
    with pytest.raises(Exception, match="only"):
        run_judges(LabelFollower(), organism_pairs(2), probes=["blind", "nope"], progress=False)
