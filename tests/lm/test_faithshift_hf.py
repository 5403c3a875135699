"""`sift-faithshift source=hf`: the main job end to end on two tiny random HF models (no downloads). Their
answers are junk, so the verification's label rule is replaced by a fixed cycle; everything else — real-item
sources, every axis, extraction from the source's models, training, transfer to the held-out model — is real. The
two models differ in shape (2 layers × 32 and 3 layers × 48): the trajectory stage maps them onto a common one."""

import itertools
import json

import pytest

from sift.config import compose
from sift.faithshift import plan_runs, run_faithshift


def save_wide_llama(path):
    """A tiny random Llama of another shape than the GPT-2 of ``tiny_dirs`` (3 layers × 48 against 2 × 32)."""
    import torch
    from tinylm import make_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = make_tokenizer(True)
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.2,
                      tie_word_embeddings=False, vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(cfg).eval().save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def job(tiny_dirs, tmp_path_factory):
    import sift.corpus.sources.hf as hf_source

    out = tmp_path_factory.mktemp("faithshift_hf")
    wide = save_wide_llama(out / "models" / "llama")
    csqa = out / "csqa.jsonl"
    csqa.write_text("\n".join(json.dumps({"id": f"q{i}", "answerKey": "ABC"[i % 3], "question": {
        "stem": f"Tom has {i + 2} apples. Ann has 3 pears. Which fruit is red {i}?", "choices": [
            {"label": "A", "text": "apple"}, {"label": "B", "text": "pear"}, {"label": "C", "text": "plum"}]}})
        for i in range(8)))
    cycle = itertools.cycle([1, 0, 1, 1, 0])
    mp = pytest.MonkeyPatch()
    mp.setattr(hf_source, "label_trace", lambda *a, **k: (next(cycle), "answer_follows_cot"))
    items = (f"source.items=[{{kind:reasoning_gym,task:basic_arithmetic,domain:arithmetic}},"
             f"{{kind:commonsenseqa,path:'{csqa}',domain:csqa}}]")
    cfg = compose("faithshift", [
        f"paths.output_dir={out / 'job'}", "source=hf", "mechanisms=null",
        f"source.models=[{tiny_dirs['gpt2']},{wide}]",
        items, "n_items=16", "source.max_new_tokens=12", "source.answer_tokens=2", "source.cue.p_cue=0.8",
        "source.family_items=8", "source.family_conditions=base",
        "detectors=[hidden_probe,biasing_features]", "controls=[text_bow,text_sift]", "seeds=[0]",
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
    # the cache stays native per model; training read both at the common shape (2 layers × 32)
    assert {m: (i["num_layers"], i["hidden_size"]) for m, i in traj["models"].items()} == {"gpt2": (2, 32),
                                                                                          "llama": (3, 48)}
    for key in ("main/hidden_probe/seed0", "transfer/model-llama/hidden_probe/seed0"):
        spec = json.loads((out / "runs" / key / "results.json").read_text())["data_spec"]
        # velocity/l1, drift/l1-2, EC, attention stability, answer_line, head masses: 2 layer slots × 2 heads × 3
        assert spec["pooled_dim"] == 32 and spec["n_channels"] == 6 + 2 * 2 * 3
        assert spec["common_shape"] == {"num_layers": 2, "hidden_size": 32, "native": {"gpt2": [2, 32],
                                                                                      "llama": [3, 48]},
                                        "mapped": ["llama"]}
    keys = {s.key for s in plan_runs(cfg)}
    assert "transfer/model-llama/hidden_probe/seed0" in keys and "transfer/domain-csqa/hidden_probe/seed0" in keys
    results = json.loads((out / "report" / "results.json").read_text())
    assert results and (out / "report" / "report.md").is_file() and res["runs"] == len(keys)
    report = (out / "report" / "report.md").read_text()
    assert "common shape 2 layers × 32" in report
    # text_sift, the control with SIFT's network on the real LM's own token ids, is trained and reported
    import numpy as np

    ts, hp = (np.load(out / "runs" / "main" / d / "seed0" / "predictions" / "test.npz", allow_pickle=True)
              for d in ("text_sift", "hidden_probe"))
    assert sorted(ts["trace_id"]) == sorted(hp["trace_id"]) and np.isfinite(ts["prob"]).all()
    assert any(line.startswith("| text_sift") for line in report.splitlines())
    # and the report answers "does a hidden-state detector beat a same-capacity text model on this LM?"
    cap = results["main_table"]["detectors"]["hidden_probe"]["margin_over_capacity_control"]
    assert cap["best_control"] == "text_sift" and cap["n_traces"] == len(hp["trace_id"])
    assert "Δ AUROC vs text_sift (same capacity)" in report


def test_models_of_different_shapes_are_accepted_before_the_corpus(tiny_dirs, tmp_path):
    from sift.faithshift import validate_plan

    wide = save_wide_llama(tmp_path / "wide")
    over = [f"paths.output_dir={tmp_path / 'job'}", "source=hf", "mechanisms=null", "wandb=false", "ablations=[]",
            "factorial_seeds=[]", "transfer.holdout_models=auto", "transfer.holdout_domains=[]"]
    specs = validate_plan(compose("faithshift", [*over, f"source.models=[{tiny_dirs['gpt2']},{wide}]"]),
                          tmp_path / "job")
    assert any(s.tags.get("holdout_model") == "wide" for s in specs)  # the plan stands, transfer included
    assert not (tmp_path / "job" / "corpus").exists()  # validation generates nothing
