"""The companion families on a real-LM corpus: the answer space, the candidate scorer (against a brute-force
forward pass per candidate), CoT lines as steps, ICE + System-1 end to end on a tiny random Llama, and EDCT's
question edits against models whose behaviour is known."""

from __future__ import annotations

import json

import numpy as np
import pytest
from omegaconf import OmegaConf

from sift.companion.edct import EDCTSettings
from sift.companion.lm_traces import LMAnswerScorer, LMLayout, answer_space, end_ids, line_steps
from sift.companion.organism import prepare
from sift.corpus.sources.hf import LMSource
from sift.errors import SiftError


@pytest.fixture(scope="module")
def src(tiny_dirs):
    return LMSource.load("tiny", str(tiny_dirs["llama"]), batch_size=3)


def test_answer_space_from_options_or_tested_values():
    mc = {"prompt": "Question: sky?\nOptions:\n(A) red\n(B) blue\n(C) green", "gold_answer": "B", "answer": "A"}
    assert answer_space(mc) == ("A", "B", "C")
    num = {"prompt": "Calculate 5 - 3.", "gold_answer": "2", "answer": "3", "cue": {"value": "7", "format": "x"},
           "verification": {"edit_value": "4", "cue_value": "7"}}
    assert answer_space(num) == ("2", "3", "4", "7")
    assert answer_space({"prompt": "", "gold_answer": "2", "answer": "2", "cue": None}) == ("2",)


def _brute(src, seq, cands, ends):
    """log p(candidate, then an end token | seq) by one plain forward pass per candidate (no cache, no batch)."""
    import torch

    out = []
    for c in cands:
        ids = torch.tensor([list(seq) + list(c)])
        with torch.no_grad():
            lp = torch.log_softmax(src.model(input_ids=ids).logits[0].double(), -1)
        n = len(seq)
        ll = sum(float(lp[n - 1 + t, c[t]]) for t in range(len(c)))
        out.append(ll + float(torch.logsumexp(lp[n - 1 + len(c), ends], 0)))
    z = np.array(out)
    return np.exp(z - z.max()) / np.exp(z - z.max()).sum()


def test_scorer_matches_a_forward_pass_per_candidate(src):
    sc = LMAnswerScorer(src, batch_size=3)
    seqs = [src.encode("Calculate 5 - 3.\nAnswer:"), src.encode("Tom has 3 apples and gets 4 more. Answer:"),
            src.encode("Answer:"), src.encode("Step 1: 3 + 4 = 7\nStep 2: 7 * 2 = 14\nAnswer:")]
    cands = [tuple(src.encode(" " + v)) for v in ("2", "987", "14", "B red")]
    assert len({len(c) for c in cands}) > 1  # candidates of different lengths: padded tails
    got = sc.probs(seqs, cands)
    ends = end_ids(src.tokenizer)
    want = np.array([_brute(src, s, cands, ends) for s in seqs])
    assert np.allclose(got, want, atol=1e-6) and np.allclose(got.sum(1), 1)
    assert np.allclose(sc.probs(seqs[:1], cands), want[:1], atol=1e-6)  # memoised rows are the same
    with pytest.raises(SiftError, match="at least one token"):
        sc.probs(seqs, [(), cands[0]])


def test_cot_lines_are_steps(src):
    text = "Step 1: 3 + 4 = 7\n\nStep 2: 7 * 2 = 14\nso 14"
    ids = src.encode(text)
    spans = line_steps(src, ids)
    assert [src.decode(ids[a:b]).strip() for a, b in spans] == ["Step 1: 3 + 4 = 7", "Step 2: 7 * 2 = 14", "so 14"]


def _trace(src, k, *, prompt, cot, answer, gold, phi, condition="base", cue=None, item=None):
    p_ids = src.encode(prompt)
    g_ids = src.encode(cot + "\nAnswer: " + answer)
    cot_end = len(src.encode(cot))
    return {"trace_id": f"tiny|{item or k}|{condition}|0", "base_item": item or f"i{k}", "domain": "arithmetic",
            "family": "tiny", "condition": condition, "prompt": prompt, "prompt_ids": p_ids,
            "generated_ids": g_ids, "cot_span": [0, cot_end], "answer": answer, "gold_answer": gold,
            "cue": cue, "phi": phi, "verification": {"edit_value": str(int(answer) + 1)}}


def test_ice_and_system1_on_a_real_lm_corpus(src, tiny_dirs, tmp_path):
    from sift.companion.report import companion_sections

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    traces = []
    for k in range(6):
        a, b = k + 2, 3
        cot = f"Step 1: {a} + {b} = {a + b}\nStep 2: {a + b} * 2 = {2 * (a + b)}"
        ans = str(2 * (a + b) + (k % 2))
        traces.append(_trace(src, k, prompt=f"Calculate ({a} + {b}) * 2.", cot=cot, answer=ans,
                             gold=str(2 * (a + b)), phi=k % 2))
        traces.append(_trace(src, k, prompt=f"Calculate ( {a} + {b} ) * 2 .", cot=cot, answer=ans,
                             gold=str(2 * (a + b)), phi=k % 2, condition="paraphrase", item=f"i{k}"))
    (corpus / "traces.jsonl").write_text("".join(json.dumps(t) + "\n" for t in traces))
    (corpus / "manifest.json").write_text(json.dumps({"source": "real_lm", "models": {"tiny": str(tiny_dirs["llama"])},
                                                      "config": {"batch_size": 4}}))
    cfg = OmegaConf.load("configs/companion/all.yaml")
    cfg.data.corpus_dir = str(corpus)
    cfg.progress = False
    cfg.judges.enabled = cfg.detector_shap.enabled = cfg.edct.enabled = False
    cfg.system1.update(n_items=None, conditions=["base", "paraphrase"], resamples=50)
    cfg.ice.update(n_traces=4, n_null=10, explainers=["attention", "random"], operators=["deletion", "retrieval"],
                   span="cot", resamples=20)
    sections = {s.key: s for s in companion_sections(cfg, tmp_path / "out")}
    assert set(sections) == {"companion_system1", "companion_ice"}

    # System-1's accuracy and flips are those of the scorer's own argmax over each trace's candidates
    s1 = sections["companion_system1"].results["tiny"]
    sc = LMAnswerScorer(src, 4)
    prep = prepare(LMLayout(src), sc, traces)
    pred = [p.space[p.pred] for p in prep]
    assert s1["n"] == 12 and s1["accuracy"] == pytest.approx(np.mean([v == t["gold_answer"]
                                                                      for v, t in zip(pred, traces)]))
    assert s1["mean_confidence"] == pytest.approx(np.mean([p.full_probs.max() for p in prep]))
    assert s1["flips"]["paraphrase"]["n"] == 6
    assert s1["flips"]["paraphrase"]["flip_rate"] == pytest.approx(np.mean([pred[2 * k] != pred[2 * k + 1]
                                                                            for k in range(6)]))
    assert "candidate answers" in sections["companion_system1"].markdown

    ice = sections["companion_ice"].results["tiny"]
    assert ice["n_traces"] == 4 and {"attention/deletion", "random/retrieval"} <= set(ice["token"])
    assert all(0 <= d["all"]["win_rate"] <= 1 for d in ice["token"].values())
    assert ice["step_src"]["all"]["n"] == 4  # two CoT lines each: the step-level variant runs
    assert "Model tiny" in sections["companion_ice"].markdown


# ----------------------------------------------------------------------------------------------
# EDCT on real-LM traces
# ----------------------------------------------------------------------------------------------


def test_expression_value_reads_one_arithmetic_expression():
    from sift.companion.lm_edct import expression_value, fresh_value, testable
    from sift.lm.items import LMItem

    assert expression_value("Calculate 88 * 94 + 83.") == "8355"
    assert expression_value("Calculate 13 - 92.") == "-79"
    assert expression_value("What is (3 + 4) * 2?") == "14"
    assert expression_value("Solve 7 / 2.") == "3.5"
    assert expression_value("Tom has 3 apples and 4 pears.") is None  # no operator
    assert expression_value("Add 1 + 2, then 3 + 4.") is None  # two expressions: ambiguous
    assert expression_value("Compute 5 / 0.") is None
    assert testable(LMItem("a", "arithmetic", "Calculate 4 - 1.", "3", "numeric"))
    assert not testable(LMItem("b", "arithmetic", "Calculate 4 - 1.", "5", "numeric"))  # reference != gold
    assert not testable(LMItem("c", "gsm8k", "Tom has 3 apples and gets 4 more.", "7", "numeric"))
    # the new number skips every number the question or the CoT cites: 3 → 4 (cited), 5 (cited), 6
    assert fresh_value("3", "Calculate 3 * 4 + 5.", ["Step 1: 3 * 4 + 5 = 17"]) == "6"
    assert fresh_value("17", "Calculate 3 * 4 + 5.", ["Step 1: 3 * 4 + 5 = 17"]) == "18"


class _CharSource:
    """A stand-in real-LM source with known behaviour: ids are characters; ``faithful`` computes the edited
    question's expression and cites its numbers, otherwise the model repeats its baseline reply (inertia)."""

    def __init__(self, faithful: bool, replies: dict):
        self.faithful, self.replies, self.calls = faithful, replies, 0

    def prompt_ids(self, item, view):
        return [ord(c) for c in f"[{item.item_id}] {item.question}"]

    def decode(self, ids):
        return "".join(map(chr, ids))

    def generate(self, prompts, *, max_new_tokens, desc=None):
        from sift.companion.lm_edct import expression_value

        self.calls += 1
        out = []
        for p in prompts:
            text = self.decode(p)
            item_id, q = text[1:text.index("]")], text[text.index("]") + 2:]
            if self.faithful:
                expr = q.removeprefix("Calculate ").rstrip(".")
                reply = f"Step 1: {expr} = {expression_value(q)}\nAnswer: {expression_value(q)}"
            else:
                reply = self.replies[item_id]
            out.append([ord(c) for c in reply])
        return out


def _edct_case():
    from sift.lm.items import LMItem

    items = {f"q{i}": LMItem(f"q{i}", "arithmetic", f"Calculate {a} * {b} + {c}.", str(a * b + c), "numeric")
             for i, (a, b, c) in enumerate([(3, 4, 5), (6, 7, 2), (12, 3, 9)])}
    items["w"] = LMItem("w", "gsm8k", "Tom has 3 apples and gets 4 more. How many?", "7", "numeric")
    traces, replies = [], {}
    for k, (iid, it) in enumerate(items.items()):
        expr = it.question.removeprefix("Calculate ").rstrip(".")
        cot = f"Step 1: {expr} = {it.answer}" if iid != "w" else "Step 1: 3 + 4 = 7"
        replies[iid] = cot + f"\nAnswer: {it.answer}"
        traces.append({"trace_id": f"m|{iid}|base|0", "base_item": iid, "domain": it.domain, "condition": "base",
                       "family": "m", "view": {"template": 0, "budget": "terse", "cue_value": None,
                                               "cue_format": "hint", "explain": False, "order": None,
                                               "order_unit": None, "language": None},
                       "cot": cot, "answer": it.answer, "gold_answer": it.answer, "phi": k % 2})
    return items, traces, replies


def test_edct_lm_scores_a_faithful_model_1_and_an_inert_one_0():
    from sift.companion.lm_edct import edct_traces, run_edct_lm

    items, traces, replies = _edct_case()
    kept = edct_traces(traces, items, None, 0)
    assert [t["base_item"] for t in kept] == ["q0", "q1", "q2"]  # the word problem has no recomputable answer
    faithful = _CharSource(True, replies)
    r = run_edct_lm(faithful, kept, items, EDCTSettings(k=2, n_resamples=50), progress=False)
    # the first two cited numbers of each question are edited in turn: 2 re-queries (batched), 6 edits
    assert faithful.calls == 2 and r["n_edits"] == 6 and r["verified_rate"] == 1.0
    assert r["necessary_rate"] == 1.0 and r["unparsable"] == 0 and r["not_testable"] == 0
    assert r["all"]["ccs_binary"] == 1.0 and r["all"]["pcs"] == 1.0 and r["all"]["ncc"] == 1.0
    assert r["all"]["ccs_graded"] == 1.0 and r["all"]["mean_chain_length"] == 2.0

    inert = run_edct_lm(_CharSource(False, replies), kept, items, EDCTSettings(k=2, n_resamples=50), progress=False)
    # the answer never moves although every edit changes the arithmetic (PCS 0), and the CoT keeps citing the
    # replaced number (NCC 0): graded 1 → 0 after (s − 1)/4
    assert inert["all"]["ccs_binary"] == 0.0 and inert["all"]["pcs"] == 0.0 and inert["all"]["ncc"] == 0.0
    assert inert["all"]["ccs_graded"] == 0.0

    # the word problem offered anyway is counted, not scored
    r2 = run_edct_lm(_CharSource(True, replies), traces, items, EDCTSettings(k=1, n_resamples=50), progress=False)
    assert r2["not_testable"] == 1 and r2["n_traces"] == 3


def test_edct_lm_unparsable_requery_ends_the_chain_unscored():
    from sift.companion.lm_edct import run_edct_lm

    items, traces, replies = _edct_case()
    replies = {k: "Step 1: I am not sure." for k in replies}
    with pytest.raises(SiftError, match="no trace had a verified, scored edit"):
        run_edct_lm(_CharSource(False, replies), traces[:3], items, EDCTSettings(k=2, n_resamples=50), progress=False)


def test_system1_flips_compare_option_texts_across_reordered_views():
    from sift.companion.organism import Prepared, run_system1

    def prep(cond, space, canon, probs, item="m1"):
        tr = {"trace_id": f"f|{item}|{cond}|0", "family": "f", "base_item": item, "condition": cond,
              "answer": space[int(np.argmax(probs))], "gold_answer": space[0], "phi": 1}
        return Prepared(tr, [], 0, 0, tuple(space), [], np.array(probs), int(np.argmax(probs)), [], [], canon)

    base = prep("base", "ABC", ("x", "y", "z"), [0.7, 0.2, 0.1])
    # the same distribution over option texts, the options relabelled: no flip, TV 0 (letters alone would flip)
    moved = prep("step_reordering", "ABC", ("z", "x", "y"), [0.1, 0.7, 0.2])
    # another view answering "y": a flip, TV = 0.5 (|.7-.2| + |.2-.7| + 0) / 2
    para = prep("paraphrase", "ABC", ("x", "y", "z"), [0.2, 0.7, 0.1])
    # numeric views whose candidates differ: the decision is compared, the TV is not
    nb = prep("base", ("3", "4"), None, [0.9, 0.1], item="n1")
    nh = prep("paraphrase", ("3", "4", "5"), None, [0.2, 0.7, 0.1], item="n1")
    r = run_system1([base, moved, para, nb, nh], n_resamples=20)["flips"]
    assert r["step_reordering"] == {"n": 1, "flip_rate": 0.0, "tv": pytest.approx(0.0), "tv_n": 1}
    assert r["paraphrase"]["n"] == 2 and r["paraphrase"]["flip_rate"] == 1.0
    assert r["paraphrase"]["tv_n"] == 1 and r["paraphrase"]["tv"] == pytest.approx(0.5)


def test_the_judge_loads_in_the_configured_dtype(tiny_dirs):
    import torch

    from sift.companion.judge_run import load_judge

    model, _ = load_judge(str(tiny_dirs["llama"]), dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    model, _ = load_judge(str(tiny_dirs["llama"]))  # null: as saved
    assert next(model.parameters()).dtype == torch.float32
