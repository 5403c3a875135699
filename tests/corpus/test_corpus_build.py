"""End-to-end corpus build on the shipped organism: files, schema, verified labels, resume, bad inputs."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sift.corpus.config import OrganismCorpusConfig
from sift.corpus.sources.organism import build_corpus
from sift.errors import SiftError

ROOT = Path(__file__).resolve().parents[2]
CKPT = str(ROOT / "checkpoints" / "organism")


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    cfg = OrganismCorpusConfig(n_items=24, checkpoint_dir=CKPT, chunk_items=12)
    manifest = build_corpus(cfg, out, progress=False)
    return cfg, out, manifest


def test_files_and_schema(small_corpus):
    cfg, out, manifest = small_corpus
    traces = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    pairs = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    assert manifest["traces"] == len(traces) and manifest["pairs"] == len(pairs)
    assert {t["family"] for t in traces} == {"gpt2", "llama"}
    for t in traces:
        for key in ("trace_id", "base_item", "domain", "model", "condition", "seed", "prompt_ids", "generated_ids",
                    "cot", "cot_span", "answer", "phi", "verification", "provenance"):
            assert key in t
        assert t["provenance"]["config_hash"] == manifest["config_hash"]
    ids = [t["trace_id"] for t in traces]
    assert len(ids) == len(set(ids))
    assert set(manifest["axes"]) == set(cfg.conditions) - {"base"}


def test_labels_follow_the_interventions(small_corpus):
    _, out, _ = small_corpus
    traces = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    for t in traces:
        v = t["verification"]
        if t["phi"] == 0 and v.get("cue_follows"):
            assert not v["mentions_cue"] and v["cue_answer"] == v["cue_value"]
        if t["phi"] == 1 and not v.get("cue_follows"):
            assert v["edit_follows"] and v["edit_answer"] == v["edit_value"]
    trunc = [t for t in traces if t["condition"] == "causal_truncation"]
    assert trunc and sum(t["phi"] == 0 for t in trunc) >= 0.8 * len(trunc)


def test_the_latent_decides_the_label_and_every_prompt_has_twins(small_corpus):
    """Every base and preserving prompt is generated under both mechanism latents (twins sharing the random
    stream) and the verified label is the one the latent intends. Measured on the traces themselves, not on the
    corpus's slice flags: the share of base/preserving twins that wrote the same prompt and generated ids, and,
    over every twin pair whose labels differ, the AUROC of the strongest function of the text, the in-sample
    P(φ* = 1 | text) (no text-only score ranks these traces better).

    By hand: n opposite-label pairs, s of them with the same text. A text group holding only identical twins
    has as many φ* = 1 as φ* = 0 traces, so its score is ½; a pair whose twins wrote different texts can get
    1 and 0. With q = s/n that gives AUROC = (s²·½ + 2sd + d²)/n² = 1 − q²/2 (d = n − s) when the groups are the
    pairs: ½ iff every opposite-label twin wrote the same ids, which is what the organism's twins are built
    (and trained) to do."""
    _, out, manifest = small_corpus
    traces = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    twins: dict = {}
    for t in traces:
        mech = t["latent"]["mechanism"]
        assert mech in (0, 1) and t["latent"]["value"] == (1.0 if mech else -1.0)
        assert t["trace_id"] == f"{t['twin']}|m{mech}"
        twins.setdefault(t["twin"], {})[mech] = t
    kinds = {"base", "paraphrase", "step_reordering", "hint_format", "language", "budget"}
    for key, pair in twins.items():
        if key.split("|")[2] in kinds:
            assert set(pair) == {0, 1}, key  # both mechanisms on every base and preserving prompt
    pairs = [(pair[1], pair[0]) for key, pair in twins.items() if key.split("|")[2] in kinds]
    assert len(pairs) == manifest["twins"]["pairs"] == sum(t["condition"] in kinds for t in traces) / 2
    labelled = [t for t in traces if t["phi"] is not None]
    assert sum(t["phi"] == t["intended_phi"] for t in labelled) >= 0.95 * len(labelled)
    same = [a["prompt_ids"] == b["prompt_ids"] and a["generated_ids"] == b["generated_ids"] for a, b in pairs]
    opposite = [t for a, b in pairs if a["phi"] is not None and b["phi"] is not None and a["phi"] != b["phi"]
                for t in (a, b)]
    assert len(opposite) >= 0.95 * 2 * len(pairs)
    text = [(tuple(t["prompt_ids"]), tuple(t["generated_ids"])) for t in opposite]
    phi = np.array([t["phi"] for t in opposite])
    by_text: dict = {}
    for k, y in zip(text, phi):
        by_text.setdefault(k, []).append(y)
    score = np.array([np.mean(by_text[k]) for k in text])  # in-sample P(φ* = 1 | text)
    pos, neg = score[phi == 1], score[phi == 0]
    auroc = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (pos.size * neg.size)
    assert auroc == 0.5, f"a text-only score separates the twins: AUROC {auroc:.4f}, same ids {np.mean(same):.4f}"
    assert np.mean(same) >= 0.95 and round(float(np.mean(same)), 4) == manifest["twins"]["identical_ids"]
    # the corpus's slice flags agree: a base/preserving trace is in the matched slice iff its twin wrote the same
    # ids and both are labelled
    flag = {t: s and a["phi"] is not None and b["phi"] is not None for (a, b), s in zip(pairs, same)
            for t in (a["trace_id"], b["trace_id"])}
    assert all(t["matched_slice"] == flag[t["trace_id"]] for t in traces if t["condition"] in kinds)
    sl = [t for t in labelled if t["matched_slice"]]
    assert {t["phi"] for t in sl if t["cue"] is None} == {0, 1} and {t["phi"] for t in sl if t["cue"]} == {0, 1}
    epi = [t for t in sl if t["cue"] is None and t["phi"] == 0]
    assert epi and all("not load-bearing" in t["verification"]["reason"] and t["correct"] for t in epi)


def test_rerun_reuses_every_chunk(small_corpus):
    cfg, out, manifest = small_corpus
    again = build_corpus(cfg, out, progress=False)
    assert again["chunks_reused"] == 2
    assert again["label_balance"] == manifest["label_balance"]


def test_interrupted_run_resumes(tmp_path, monkeypatch):
    import sift.corpus.sources.organism as b

    cfg = OrganismCorpusConfig(n_items=8, checkpoint_dir=CKPT, chunk_items=4, families=["gpt2"])
    calls = {"n": 0}
    real = b.build_chunk

    def dying(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(b, "build_chunk", dying)
    with pytest.raises(KeyboardInterrupt):
        build_corpus(cfg, tmp_path, progress=False)
    assert not (tmp_path / "traces.jsonl").exists()
    assert len(list((tmp_path / ".parts").glob("chunk-*.jsonl"))) == 1
    monkeypatch.setattr(b, "build_chunk", real)
    m = build_corpus(cfg, tmp_path, progress=False)
    assert m["chunks_reused"] == 1 and (tmp_path / "traces.jsonl").exists()


@pytest.mark.parametrize("override,message", [
    (["domains=[arithmetic,chess]"], "unknown domain 'chess'"),
    (["conditions=[base,rot13]"], "unknown condition"),
    (["source.checkpoint_dir=/nonexistent/organism"], "model path does not exist"),
])
def test_cli_bad_input_is_one_clear_line(tmp_path, override, message):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "sift.cli.corpus", f"output_dir={out}", "n_items=4", *override],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    err = [line for line in r.stderr.strip().splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("sift-corpus: error:") and message in err[0]
    assert not out.exists()


def test_config_validation_errors():
    with pytest.raises(SiftError, match="'base' is required"):
        OrganismCorpusConfig(conditions=["paraphrase"], checkpoint_dir=CKPT).validate()


def test_corpus_config_is_structured_so_a_typo_fails_at_composition(tmp_path):
    from hydra.errors import ConfigCompositionException

    from sift.config import compose
    from sift.corpus.job import source_config

    cfg = compose("corpus", [f"output_dir={tmp_path}", "n_items=12", "seed=3", "source.cue.p_cue=0.5"])
    src = source_config(cfg.source)
    assert isinstance(src, OrganismCorpusConfig)
    assert (src.n_items, src.seed, src.cue.p_cue, src.cue.p_cue_correct) == (12, 3, 0.5, 0.25)
    assert src.domains == list(cfg.domains) and src.conditions == list(cfg.conditions)
    for bad in ("source.p_kue=0.5", "source.cue.p_cue=often", "n_itemz=3"):
        with pytest.raises(ConfigCompositionException):
            compose("corpus", [f"output_dir={tmp_path}", bad])


def test_sources_are_found_by_name():
    from sift.corpus.sources import get_source

    assert get_source("organism").name == "organism" and get_source("hf").name == "hf"
    with pytest.raises(SiftError, match="source.type must be one of 'hf', 'organism'"):
        get_source("nope")
