"""Companion runs on the organism: trace loading, CoT parsing, EDCT with rule-based stand-in organisms
(analytic CCS), and a smoke run of ICE / EDCT / System-1 on the shipped organism."""

import json
import math

import numpy as np
import pytest

from sift.companion import organism as O
from sift.companion.edct import EDCTSettings
from sift.errors import SiftError

COT = "4 - 2 = 2 ; 2 + 5 = 7 ; 7 - 1 = 6 ;".split()
PROMPT = "terse tom has 4 pens . loses 2 . gets 5 more . loses 1 . how many pens now ? reason :".split()


def test_parse_steps_and_reference_answer():
    st = O.parse_steps(COT)
    assert [(s.lhs, s.op, s.rhs, s.result) for s in st] == [("4", "-", "2", "2"), ("2", "+", "5", "7"),
                                                            ("7", "-", "1", "6")]
    assert [s.result_pos for s in st] == [4, 10, 16]
    assert O.reference_answer("arithmetic", "3", st[1:]) == "7"  # 3 + 5 − 1
    assert O.reference_answer("arithmetic", "9", st[1:]) is None  # 9 + 5 leaves 0..9
    assert O.reference_answer("modular", "5", [O.ParsedStep("x", "*", "3", "?", 0, 0)]) == "1"  # 15 mod 7
    xx = O.parse_steps("true qdna false = false ;".split())  # the second lexicon's 'and'
    assert xx[0].op == "and" and O.reference_answer("boolean", "true", []) == "true"
    assert O.reference_answer("choice", "5", [], options=(("a", "3"), ("b", "5"))) == "b"
    assert O.reference_answer("choice", "6", [], options=(("a", "3"), ("b", "5"))) is None


def _write(tmp_path, rows):
    p = tmp_path / "traces.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return tmp_path


def _row(i, phi, cond="base", fam="gpt2"):
    return {"trace_id": f"{fam}|x{i}|{cond}|0", "base_item": f"arit-0-{i:06d}", "domain": "arithmetic",
            "family": fam, "condition": cond, "prompt_ids": [1], "generated_ids": [2], "cot_span": [0, 1],
            "answer": "3", "phi": phi}


def test_load_traces_filters_balances_and_names_bad_input(tmp_path):
    rows = [_row(i, int(i < 3)) for i in range(10)] + [_row(20, 1, cond="paraphrase"), {**_row(21, None)}]
    d = _write(tmp_path, rows)
    got = O.load_traces(d, conditions=["base"], n=6)
    assert len(got) == 6 and sum(r["phi"] for r in got) == 3  # balanced over φ* as far as the classes allow
    assert all(r["condition"] == "base" and r["phi"] is not None for r in got)
    assert O.load_traces(d, conditions=["base"], n=6) == got  # deterministic
    with pytest.raises(SiftError, match="traces.jsonl: no such file"):
        O.load_traces(tmp_path / "nope")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "traces.jsonl").write_text(json.dumps({k: v for k, v in _row(0, 1).items() if k != "cot_span"}) + "\n")
    with pytest.raises(SiftError, match=r"traces.jsonl:1: missing field\(s\) \['cot_span'\]"):
        O.load_traces(bad)
    with pytest.raises(SiftError, match="no trace matches"):
        O.load_traces(d, families=["llama"])


class RuleOrganism:
    """A word-level stand-in with ``ids / words / generate``: continues a CoT prefix either faithfully (from the
    last stated value) or inertly (replaying its original steps and answer)."""

    def __init__(self, faithful: bool):
        self.faithful = faithful
        self.vocab: list[str] = []

    def ids(self, words):
        for w in words:
            if w not in self.vocab:
                self.vocab.append(w)
        return [self.vocab.index(w) for w in words]

    def words(self, ids):
        return [self.vocab[i] for i in ids]

    def generate(self, prompts, max_new_tokens=64):
        out = []
        for p in prompts:
            w = self.words(p)
            cot = w[w.index("reason") + 2:]
            done = sum(x == "=" for x in cot)
            steps = O.parse_steps(COT)
            cont: list[str] = []
            cur = cot[-1]
            for s in steps[done:]:
                if self.faithful:
                    nxt = str(int(cur) + int(s.rhs)) if s.op == "+" else str(int(cur) - int(s.rhs))
                    cont += [";", cur, s.op, s.rhs, "=", nxt]
                    cur = nxt
                else:
                    cont += [";", s.lhs, s.op, s.rhs, "=", s.result]
            ans = cur if self.faithful else "6"
            out.append(self.ids(cont + [";", "answer", ":", ans]))
        return out


def _prepared(src, phi):
    ids = src.ids(PROMPT) + src.ids(COT) + src.ids(["answer", ":"])
    tr = {"trace_id": f"t{phi}", "base_item": "arit-0-000000", "domain": "arithmetic", "answer": "6", "phi": phi,
          "cue": None, "gold_answer": "6"}
    return O.Prepared(tr, ids, len(PROMPT), len(COT), tuple(str(v) for v in range(10)), list(range(10)),
                      np.full(10, 0.1), 6, list(COT), [])


def test_edct_faithful_vs_inert_organisms():
    good = RuleOrganism(faithful=True)
    r = O.run_edct(good, [_prepared(good, 1)], EDCTSettings(k=2, n_resamples=50), progress=False)
    s = r["samples"][0]
    assert (s["k_prime"], s["ccs"], s["pcs"], s["ncc"], s["graded"]) == (2, 1.0, 1.0, 1.0, 1.0)
    assert r["verified_rate"] == 1.0 and r["necessary_rate"] == 1.0
    bad = RuleOrganism(faithful=False)
    r = O.run_edct(bad, [_prepared(bad, 0)], EDCTSettings(k=2, n_resamples=50), progress=False)
    s = r["samples"][0]
    # step 1: answer inert (PCS 0), next step restarts from the replaced 7 (NCC 0) → rubric 1;
    # step 2: the last result edited, answer still 6 (PCS 0), no later step (NCC 1) → rubric 2
    assert (s["k_prime"], s["ccs"], s["pcs"], s["ncc"]) == (2, 0.0, 0.0, 0.5)
    assert s["graded"] == pytest.approx((0 + 0.25) / 2)


def test_edct_auroc_separates_classes():
    good, bad = RuleOrganism(True), RuleOrganism(False)
    a = O.run_edct(good, [_prepared(good, 1)], EDCTSettings(n_resamples=20), progress=False)["samples"]
    b = O.run_edct(bad, [_prepared(bad, 0)], EDCTSettings(n_resamples=20), progress=False)["samples"]
    s = O.summarize_edct(a + b, [], n_resamples=20, seed=0, config={})
    assert s["auroc_ccs_vs_phi"] == 1.0 and s["phi=1"]["ccs_binary"] == 1.0 and s["phi=0"]["ccs_binary"] == 0.0


# ---------------------------------------------------------------------------------------------- organism smoke


@pytest.fixture(scope="module")
def organism_corpus(tmp_path_factory):
    from sift.corpus.config import OrganismCorpusConfig
    from sift.corpus.sources.organism import build_corpus
    from sift.organism import DEFAULT_CHECKPOINTS

    if not (DEFAULT_CHECKPOINTS / "gpt2" / "config.json").exists():
        pytest.skip("no organism checkpoint")
    out = tmp_path_factory.mktemp("corpus")
    build_corpus(OrganismCorpusConfig(n_items=8, families=["gpt2"], conditions=["base", "paraphrase", "cue_injection"]),
                 out, progress=False)
    return out


def test_organism_ice_edct_system1_smoke(organism_corpus):
    from sift.organism import DEFAULT_CHECKPOINTS
    from sift.organism.source import OrganismSource

    src = OrganismSource.load("gpt2", DEFAULT_CHECKPOINTS / "gpt2")
    sc = O.OrganismScorer(src)
    traces = O.load_traces(organism_corpus, conditions=["base", "cue_injection"], n=4)
    prep = O.prepare(O.OrganismLayout(src), sc, traces)
    for p in prep:
        np.testing.assert_allclose(p.full_probs.sum(), 1.0)
        m = O.content_mask(p, src, "both")
        words = src.words(p.ids)
        assert (not m[0] and words[p.n_prompt - 2:p.n_prompt] == ["reason", ":"]
                and not m[p.n_prompt - 2:p.n_prompt].any())
        assert m[p.n_prompt:p.n_prompt + p.n_cot].all() and not m[p.n_prompt + p.n_cot:].any()
        assert not any(m[i] for i, w in enumerate(words[:3]) if w in O.HEADER_WORDS)
    r = O.run_ice(src, sc, prep, O.ICESettings(explainers=("attention", "random"),
                                               operators=("deletion", "retrieval"), n_null=12, n_resamples=20),
                  progress=False)
    t = r["token"]["attention/deletion"]["all"]
    assert t["n"] >= 1 and 0 <= t["win_rate"] <= t["midrank_win_rate"] <= 1
    assert set(r["operator_gap"]) == {"attention", "random"}
    assert r["step_src"]["all"]["n"] >= 1
    e = O.run_edct(src, prep, EDCTSettings(n_resamples=20), progress=False)
    assert e["n_traces"] == len(prep) and 0 <= e["verified_rate"] <= 1
    s = O.run_system1(O.prepare(O.OrganismLayout(src), sc, O.load_traces(organism_corpus)), n_resamples=20)
    assert 0 <= s["ece_w"] <= 1 and s["mce_w"] >= s["ece_w"] and "paraphrase" in s["flips"]
    assert s["ece_w"] >= abs(s["accuracy"] - s["mean_confidence"]) - 1e-12
    assert not math.isnan(s["brier"])


def test_edct_settings_one_node_for_both_paths():
    from omegaconf import OmegaConf

    node = OmegaConf.create({"k": 3, "tau_in": 0.4, "tau_out": 0.1, "graded_scheme": "over_five", "resamples": 9})
    st = EDCTSettings.from_config(node, seed=5, max_new_tokens=100)
    assert st == EDCTSettings(k=3, tau_in=0.4, tau_out=0.1, graded_scheme="over_five", max_new_tokens=100,
                              n_resamples=9, seed=5)
    assert st.record(100) == {"k": 3, "tau_in": 0.4, "tau_out": 0.1, "graded_scheme": "over_five",
                              "max_new_tokens": 100, "n_resamples": 9, "seed": 5}
    with pytest.raises(SiftError, match="graded_scheme: 'minus1'"):
        EDCTSettings(graded_scheme="minus1")


def test_add_an_ice_explainer_and_operator(monkeypatch):
    """ICE's explainers and operators are registries: a new entry is accepted by the settings and dispatched to;
    an unknown name is refused with the known ones."""
    from types import SimpleNamespace

    import torch

    monkeypatch.setitem(O.EXPLAINERS, "position", lambda src, p, rng: np.arange(len(p.ids), dtype=float))
    monkeypatch.setitem(O.OPERATORS, "keep_all", lambda pool, seed: (lambda units, keep: list(units)))
    st = O.ICESettings(explainers=("position", "random"), operators=("keep_all", "deletion"))
    assert st.explainers == ("position", "random")
    p = SimpleNamespace(ids=[5, 6, 7], latent=None)
    src = SimpleNamespace(model=torch.nn.Linear(1, 1))
    assert O.token_attribution(src, p, "position", np.random.default_rng(0)).tolist() == [0.0, 1.0, 2.0]
    assert O.OPERATORS["keep_all"]([], 0)([1, 2], np.array([False, True])) == [1, 2]
    with pytest.raises(SiftError, match=r"unknown explainer 'lime' \(attention, .*position\)"):
        O.ICESettings(explainers=("lime",), operators=("deletion",))
    with pytest.raises(SiftError, match=r"unknown operator 'blur'"):
        O.ICESettings(explainers=("random",), operators=("blur",))
