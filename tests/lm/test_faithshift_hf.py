"""`sift-faithshift source=hf`: the main job end to end on two tiny random HF models (no downloads). Their
answers are junk, so the verification's label rule is replaced by a fixed cycle; everything else — real-item
sources, every axis, extraction from the source's models, training, transfer to the held-out model — is real."""

import itertools
import json

import pytest

from sift.config import compose
from sift.faithshift import plan_runs, run_faithshift


@pytest.fixture(scope="module")
def job(tiny_dirs, tmp_path_factory):
    import sift.corpus.verify as verify

    out = tmp_path_factory.mktemp("faithshift_hf")
    csqa = out / "csqa.jsonl"
    csqa.write_text("\n".join(json.dumps({"id": f"q{i}", "answerKey": "ABC"[i % 3], "question": {
        "stem": f"Tom has {i + 2} apples. Ann has 3 pears. Which fruit is red {i}?", "choices": [
            {"label": "A", "text": "apple"}, {"label": "B", "text": "pear"}, {"label": "C", "text": "plum"}]}})
        for i in range(8)))
    cycle = itertools.cycle([1, 0, 1, 1, 0])
    mp = pytest.MonkeyPatch()
    mp.setattr(verify, "phi_from_tests", lambda *a: (next(cycle), "forced"))
    items = (f"source.items=[{{kind:reasoning_gym,task:basic_arithmetic,domain:arithmetic}},"
             f"{{kind:commonsenseqa,path:'{csqa}',domain:csqa}}]")
    cfg = compose("faithshift", [
        f"paths.output_dir={out / 'job'}", "source=hf", f"source.models=[{tiny_dirs['gpt2']},{tiny_dirs['llama']}]",
        items, "n_items=16", "source.max_new_tokens=12", "source.answer_tokens=2", "source.cue.p_cue=0.8",
        "source.family_items=8", "source.family_conditions=base",
        "detectors=[hidden_probe,biasing_features]", "controls=[text_bow]", "seeds=[0]",
        "max_epochs=2", "ablations=[]", "factorial_seeds=[]", "transfer.detectors=[hidden_probe]",
        "transfer.holdout_domains=[csqa]", "transfer.holdout_models=auto", "bootstrap.resamples=20",
        "bootstrap.appendix_resamples=10", "wandb=false", "workers=1", "instance_ensemble=[]"])
    try:
        yield cfg, out / "job", run_faithshift(cfg)
    finally:
        mp.undo()


def test_the_main_job_runs_on_real_lm_sources(job):
    cfg, out, res = job
    manifest = json.loads((out / "corpus" / "manifest.json").read_text())
    assert manifest["source"] == "real_lm" and set(manifest["models"]) == {"gpt2", "llama"}
    traces = [json.loads(line) for line in (out / "corpus" / "traces.jsonl").read_text().splitlines()]
    # the second model generated base traces on the first 8 (interleaved) items only
    second = [r for r in traces if r["family"] == "llama"]
    assert {r["condition"] for r in second} == {"base"} and len(second) == 8
    assert {r["domain"] for r in traces} == {"arithmetic", "csqa"}
    # every axis built pairs, or says why it could not
    for axis, info in manifest["axes"].items():
        assert info["built"] > 0 or info.get("not_applicable_reason") or "eligible_bases" in info, axis
    assert manifest["parse_failures"]["traces"] == len(traces)
    assert {"agreement", "kappa", "both_tests"} <= set(manifest["interventions"])
    # extraction read both source models; the report exists with the held-out-model transfer run
    traj = json.loads((out / "trajectories" / "trajectories.json").read_text())
    assert set(traj["models"]) == {"gpt2", "llama"}
    keys = {s.key for s in plan_runs(cfg)}
    assert "transfer/model-llama/hidden_probe/seed0" in keys and "transfer/domain-csqa/hidden_probe/seed0" in keys
    results = json.loads((out / "report" / "results.json").read_text())
    assert results and (out / "report" / "report.md").is_file() and res["runs"] == len(keys)


def test_models_of_different_shapes_are_refused_before_the_corpus(tiny_dirs, tmp_path):
    from tinylm import make_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    from sift.errors import SiftError
    from sift.faithshift import validate_plan

    tok = make_tokenizer(True)
    wide = LlamaForCausalLM(LlamaConfig(hidden_size=48, intermediate_size=64, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tok)))
    wide.save_pretrained(tmp_path / "wide")
    tok.save_pretrained(tmp_path / "wide")
    over = [f"paths.output_dir={tmp_path / 'job'}", "source=hf", "wandb=false", "ablations=[]", "factorial_seeds=[]",
            "transfer.holdout_models=auto", "transfer.holdout_domains=[]"]
    with pytest.raises(SiftError, match=r"differ in layers/width \(gpt2: 2 layers × 32, wide: 3 layers × 48\)"):
        validate_plan(compose("faithshift", [*over, f"source.models=[{tiny_dirs['gpt2']},{tmp_path / 'wide'}]"]),
                      tmp_path / "job")
    assert not (tmp_path / "job" / "corpus").exists()  # nothing generated
    same = compose("faithshift", [*over, f"source.models=[{tiny_dirs['gpt2']},{tiny_dirs['llama']}]"])
    assert validate_plan(same, tmp_path / "job")  # one shape: the plan stands
