"""``sift-companion`` end to end on the tiny config: every family, report.md + results.json with provenance."""

import json

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import sift.cli.companion as cli  # registers the primary config
from sift.cli._common import CONFIG_DIR
from sift.errors import SiftError


def _cfg(*overrides):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("sift_companion", overrides=list(overrides))
    GlobalHydra.instance().clear()
    return cfg


def _word_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from sift.companion.judge_run import organism_pairs

    words = sorted({w for it in organism_pairs(3) for t in (it.question, *it.candidates) for w in t.split()})
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", "<eos>"] + words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<eos>",
                            pad_token="<eos>").save_pretrained(str(path))
    return path


def test_config_group_options():
    for opt in ("none", "all", "tiny", "ice", "edct", "judges", "system1", "detector_shap"):
        c = _cfg(f"companion={opt}").companion
        assert c.enabled == (opt != "none")
    c = _cfg("companion=ice").companion
    assert c.ice.enabled and not (c.edct.enabled or c.judges.enabled or c.system1.enabled or c.detector_shap.enabled)
    from sift.companion.report import companion_sections

    assert companion_sections(_cfg("companion=none"), "/nonexistent") == []
    with pytest.raises(SiftError, match="nothing to run"):
        cli.run(_cfg("companion=none"))


def test_bad_corpus_dir_is_one_clear_error(tmp_path):
    cfg = _cfg("companion=system1", f"output_dir={tmp_path / 'o'}", f"companion.data.corpus_dir={tmp_path / 'none'}")
    with pytest.raises(SiftError, match="traces.jsonl: no such file"):
        cli.run(cfg)


def test_the_report_builds_nothing(tmp_path):
    """Without the job's folders the companion report stops with one line instead of building a corpus or
    training a detector."""
    with pytest.raises(SiftError, match="companion.data.corpus_dir is not set"):
        cli.run(_cfg("companion=system1", f"output_dir={tmp_path / 'o'}"))
    with pytest.raises(SiftError, match="companion.detector_shap.run_dir is not set"):
        cli.run(_cfg("companion=detector_shap", f"output_dir={tmp_path / 'o'}"))
    with pytest.raises(SiftError, match="results.json: no such file"):
        cli.run(_cfg("companion=detector_shap", f"output_dir={tmp_path / 'o'}",
                     f"companion.detector_shap.run_dir={tmp_path / 'nothing'}"))
    assert not (tmp_path / "o" / "companion" / "corpus").exists()


def synthetic_run(root):
    """A training run folder as sift-train writes it (results.json naming the checkpoint and holding the data
    config), of a small SIFT on the synthetic DataModule."""
    import pytorch_lightning as pl

    from datamodules.synthetic_datamodule import SyntheticDataModule
    from sift.detectors import DataSpec
    from sift.detectors.sift_model import SIFTDetector

    data = {"_target_": "datamodules.synthetic_datamodule.SyntheticDataModule",
            "generator": {"n_items": 60, "data_seed": 0}}
    dm = SyntheticDataModule(generator=dict(n_items=60, data_seed=0))
    dm.setup()
    pl.seed_everything(0)
    det = SIFTDetector(data=DataSpec.from_datamodule(dm),
                       net={"d_model": 16, "filters": 4, "n_layers": 1, "n_heads": 2, "dim_feedforward": 32,
                            "mlp_hidden": 16}, objective={"use_irm": False, "use_dann": False})
    tr = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
    tr.fit(det, dm.train_dataloader())
    root.mkdir(parents=True)
    tr.save_checkpoint(root / "best.ckpt")
    (root / "results.json").write_text(json.dumps({"best_ckpt": str(root / "best.ckpt"), "config": {"data": data}}))
    return root


def test_detector_shap_explains_a_given_run(tmp_path):
    run = synthetic_run(tmp_path / "run")
    r = cli.run(_cfg("companion=detector_shap", f"output_dir={tmp_path / 'o'}",
                     f"companion.detector_shap.run_dir={run}", "companion.detector_shap.n_explain=8"))
    res = json.loads((tmp_path / "o" / "results.json").read_text())["companion_detector_shap"]
    assert r["sections"] == ["companion_detector_shap"] and res["n_traces"] == 8
    assert res["detector"].startswith(f"run {run} (checkpoint best.ckpt)") and res["efficiency_error"] < 1e-9


@pytest.mark.slow  # every family end to end: minutes on 2 CPU cores
def test_sift_companion_tiny_end_to_end(tmp_path):
    from sift.organism import DEFAULT_CHECKPOINTS

    if not (DEFAULT_CHECKPOINTS / "gpt2" / "config.json").exists():
        pytest.skip("no organism checkpoint")
    from sift.corpus.config import OrganismCorpusConfig
    from sift.corpus.sources.organism import build_corpus

    tok = _word_tokenizer(tmp_path / "tok")
    corpus = tmp_path / "corpus"  # the job's folders, made here: the report stage reads them
    build_corpus(OrganismCorpusConfig(n_items=16, families=["gpt2"], conditions=["base", "paraphrase", "cue_injection"],
                                      audit_seeds=1), corpus, progress=False)
    run = synthetic_run(tmp_path / "run")
    out = tmp_path / "out"
    r = cli.run(_cfg("companion=tiny", f"output_dir={out}", f"companion.judges.tokenizer={tok}",
                     f"companion.data.corpus_dir={corpus}", f"companion.detector_shap.run_dir={run}"))
    assert r["sections"] == ["companion_system1", "companion_ice", "companion_edct", "companion_judges",
                             "companion_detector_shap"]
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["config_hash"] and res["meta"]["seed"] == 0 and res["meta"]["sift_version"]
    for key in r["sections"]:
        assert res[key]["provenance"]["config_hash"] == res["meta"]["config_hash"]
    assert 0 <= res["companion_system1"]["gpt2"]["ece_w"] <= 1
    assert "attention/deletion" in res["companion_ice"]["gpt2"]["token"]
    assert res["companion_edct"]["gpt2"]["n_traces"] > 0
    assert res["companion_judges"]["n_items"] == 3
    assert res["companion_detector_shap"]["efficiency_error"] < 1e-9
    md = (out / "report.md").read_text()
    for title in ("ICE", "EDCT", "System-1", "Cue-anchored judging", "S1-SHAP"):
        assert title in md
    for fig in ("reliability_gpt2.png", "ice_win_rates_gpt2.png", "edct_gpt2.png", "detector_groups.png"):
        assert (out / "companion" / fig).stat().st_size > 0
    assert (out / "companion" / "judges_records.json").exists()
    assert all((out / "companion" / f"{k}.json").exists() for k in r["sections"])  # written per family


def test_add_a_companion_family(tmp_path, monkeypatch):
    """A new family is one registered function and its config node: it runs in its place, its section and
    results file appear, and a disabled or absent node skips it."""
    from omegaconf import OmegaConf

    from sift.companion import families as F
    from sift.companion.report import companion_sections
    from sift.report import Section

    assert [f.name for f in F.families()] == ["system1", "ice", "edct", "judges", "detector_shap"]
    seen = []

    def count_words(cfg, sources, out):
        seen.append(int(cfg.count_words.n))
        return Section("companion_count_words", "Count words", "n = 3", [], {"n": int(cfg.count_words.n)})

    F.families()  # the built-ins register on import: import them before taking the copy
    monkeypatch.setattr(F, "FAMILIES", F.FAMILIES.copy())
    F.register_family("count_words", 5)(count_words)
    assert [f.name for f in F.families()][:2] == ["count_words", "system1"]
    cfg = OmegaConf.create({"enabled": True, "seed": 0, "progress": False, "data": {},
                            "count_words": {"enabled": True, "n": 3}})
    (s,) = companion_sections(cfg, tmp_path)
    assert seen == [3] and s.key == "companion_count_words" and s.results["n"] == 3
    assert json.loads((tmp_path / "companion" / "companion_count_words.json").read_text())["n"] == 3
    cfg.count_words.enabled = False
    assert companion_sections(cfg, tmp_path) == []
    with pytest.raises(SiftError, match="registered twice"):
        F.register_family("count_words", 5)(lambda cfg, sources, out: None)
