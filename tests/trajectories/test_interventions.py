"""Counterfactual interventions: which tokens they touch, and that the profile matches a direct computation."""

import pytest
import torch

from sift.trajectories.extract import ExtractConfig, Extractor
from sift.trajectories.interventions import TokenText, intervened_cot, profile_names
from sift.trajectories.toy import toy_model, toy_records, toy_tokenizer


@pytest.fixture(scope="module")
def tt():
    return TokenText(toy_tokenizer(), ExtractConfig.value_pattern, ExtractConfig.step_pattern)


def ids(words):
    return toy_tokenizer().convert_tokens_to_ids(words)


def test_first_step_edit_touches_the_first_result_only(tt):
    cot = ids("4 - 2 = 2 ; 2 + 5 = 7 ;".split())
    out = intervened_cot("first_step_edit", cot, tt)
    assert toy_tokenizer().convert_ids_to_tokens(out) == "4 - 2 = 1 ; 2 + 5 = 7 ;".split()
    assert intervened_cot("first_step_edit", ids("2 + 5 = 7 ;".split()), tt) is None  # = the verifying edit
    bools = intervened_cot("first_step_edit", ids("true and false = false ; false or true = true ;".split()), tt)
    assert toy_tokenizer().convert_ids_to_tokens(bools)[4] == "true"


def test_step_dropped_and_cot_deleted(tt):
    cot = ids("4 - 2 = 2 ; 2 + 5 = 7 ;".split())
    assert toy_tokenizer().convert_ids_to_tokens(intervened_cot("step_dropped", cot, tt)) == "2 + 5 = 7 ;".split()
    assert intervened_cot("step_dropped", ids("2 + 5 = 7 ;".split()), tt) is None
    assert intervened_cot("cot_deleted", cot, tt) == []


@torch.no_grad()
def test_profile_matches_direct_teacher_forced_pass():
    tok = toy_tokenizer()
    m = toy_model("gpt2")
    r = next(r for r in toy_records(4, families=("gpt2",)) if r["cot"].count(";") >= 2)
    out = Extractor(m, ExtractConfig(), tokenizer=tok).extract_many([r])
    names = profile_names(ExtractConfig().interventions)
    prof = dict(zip(names, out["profile"][0].tolist()))
    assert all(prof[f"cf/{n}/available"] == 1.0 for n in ("cot_deleted", "first_step_edit", "step_dropped"))

    def logp(seq, target):
        lp = torch.log_softmax(m(input_ids=torch.tensor([seq])).logits[0, -1], -1)
        return lp[target].item(), int(lp.argmax())

    gen, c1 = r["generated_ids"], r["cot_span"][1]
    base, _ = logp(r["prompt_ids"] + gen[:-1], gen[-1])
    assert out["answer_logp"][0].item() == pytest.approx(base, abs=1e-4)
    deleted, top = logp(r["prompt_ids"] + gen[c1:-1], gen[-1])
    assert prof["cf/cot_deleted/delta_logp"] == pytest.approx(deleted - base, abs=1e-4)
    assert prof["cf/cot_deleted/flip"] == float(top != gen[-1])
