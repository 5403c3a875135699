"""The config tree: one node per concept (sgr, bootstrap, paths) and schemas that refuse a misspelt or
mistyped key at composition, naming it."""

from __future__ import annotations

import pytest
import yaml
from hydra.errors import ConfigCompositionException

import sift.corpus.config  # noqa: F401  (registers the corpus and source schemas, as every CLI entry point does)
from sift.config import compose
from sift.resources import config_dir

MAIN = ("faithshift", "train", "evaluate")


def _error(config: str, overrides: list[str]) -> str:
    """The composition error's message and its cause's (Hydra wraps the schema's error)."""
    with pytest.raises(ConfigCompositionException) as e:
        compose(config, overrides)
    return f"{e.value} {e.value.__cause__ or ''}"


@pytest.mark.parametrize("config", MAIN)
@pytest.mark.parametrize("typo", ["sgr.alpah=0.1", "paths.ouput_dir=/tmp/x"])
def test_a_misspelt_key_fails_at_composition_naming_it(config, typo):
    assert typo.split("=")[0] in _error(config, [typo])


@pytest.mark.parametrize("config", ["faithshift", "evaluate"])
def test_a_misspelt_bootstrap_key_fails_at_composition(config):
    assert "bootstrap.resampels" in _error(config, ["bootstrap.resampels=3"])


@pytest.mark.parametrize("override, key", [
    ("sgr.alpha=high", "sgr.alpha"), ("n_items=abc", "n_items"), ("seeds=[0,x]", "seeds"),
    ("bootstrap.resamples=1.5", "bootstrap.resamples")])
def test_a_mistyped_value_fails_at_composition_naming_the_key(override, key):
    assert f"full_key: {key}" in _error("faithshift", [override])


def test_a_typo_in_a_users_preset_file_fails_at_composition(tmp_path, monkeypatch):
    (tmp_path / "preset").mkdir()
    (tmp_path / "preset" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - quick\n  - _self_\nbootstrap:\n  resampels: 3\n")
    monkeypatch.setenv("SIFT_CONFIG_DIR", str(tmp_path))
    msg = _error("faithshift", ["preset=mine"])
    assert "resampels" in msg and "bootstrap" in msg
    monkeypatch.setenv("SIFT_CONFIG_DIR", "")
    (tmp_path / "preset" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - quick\n  - _self_\nbootstrap:\n  resamples: 3\n")
    monkeypatch.setenv("SIFT_CONFIG_DIR", str(tmp_path))
    assert compose("faithshift", ["preset=mine"]).bootstrap.resamples == 3


EXTRACT = ["corpus_dir=/tmp/c", "output_dir=/tmp/t"]


@pytest.mark.parametrize("override, key", [("extraction.t_mx=8", "extraction.t_mx"), ("famlies=[gpt2]", "famlies"),
                                           ("trainer.device=2", "trainer.device")])
def test_extract_schema_refuses_a_misspelt_key(override, key):
    assert key in _error("extract", [*EXTRACT, override])


@pytest.mark.parametrize("override, key", [("extraction.t_max=long", "extraction.t_max"),
                                           ("overwrite=perhaps", "overwrite")])
def test_extract_schema_refuses_a_mistyped_value(override, key):
    assert f"full_key: {key}" in _error("extract", [*EXTRACT, override])


@pytest.mark.parametrize("option", ["all", "tiny", "real_lm", "ice", "edct", "judges", "system1", "detector_shap"])
def test_every_companion_option_is_checked_by_the_companion_schema(option):
    cfg = compose("evaluate", ["paths.output_dir=/tmp/e", f"companion={option}"])
    assert set(cfg.companion) == {"enabled", "seed", "progress", "data", "system1", "ice", "edct", "judges",
                                  "detector_shap"}
    assert "companion.ice.n_trace" in _error("evaluate", ["paths.output_dir=/tmp/e", f"companion={option}",
                                                          "companion.ice.n_trace=3"])
    assert "full_key: companion.edct.k" in _error("evaluate", ["paths.output_dir=/tmp/e", f"companion={option}",
                                                               "companion.edct.k=two"])


def test_a_typo_in_a_users_companion_file_fails_at_composition(tmp_path, monkeypatch):
    (tmp_path / "companion").mkdir()
    (tmp_path / "companion" / "mine.yaml").write_text("defaults:\n  - all\n  - _self_\nice:\n  n_tracs: 3\n")
    monkeypatch.setenv("SIFT_CONFIG_DIR", str(tmp_path))
    assert "n_tracs" in _error("evaluate", ["paths.output_dir=/tmp/e", "companion=mine"])


def test_extraction_defaults_are_the_codes():
    from sift.trajectories.extract import ExtractConfig

    node = compose("extract", EXTRACT).extraction
    assert ExtractConfig(**node) == ExtractConfig()


def test_each_job_reads_one_sgr_and_one_bootstrap_node():
    fs = compose("faithshift", ["seed=3"])
    assert dict(fs.sgr) == {"alpha": 0.25, "delta": 0.05, "bound": "betting", "candidates": None, "max_traces": None,
                            "alphas": [0.25, 0.3], "match_coverage": 0.7}
    assert (fs.bootstrap.resamples, fs.bootstrap.appendix_resamples, fs.bootstrap.seed) == (1000, 200, 3)
    quick = compose("faithshift", ["preset=quick"])
    assert (quick.bootstrap.resamples, quick.bootstrap.appendix_resamples) == (200, 100)
    assert compose("faithshift", ["preset=paper"]).bootstrap.appendix_resamples == 1000
    ev = compose("evaluate", ["paths.output_dir=/tmp/e", "sgr.alpha=0.4", "bootstrap.resamples=7"])
    assert (ev.sgr.alpha, ev.bootstrap.resamples, ev.bootstrap.seed) == (0.4, 7, 0)
    tr = compose("train", ["paths.output_dir=/tmp/t", "callbacks=meta_eval", "sgr.delta=0.1"])
    assert (tr.callbacks.meta_eval.alpha, tr.callbacks.meta_eval.delta) == (0.25, 0.1)
    assert tr.paths.ckpt_dir == "/tmp/t/checkpoints"
    assert compose("faithshift", []).paths.output_dir == "./outputs/faithshift"


def _keys(node, where=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield f"{where}{k}", v
            yield from _keys(v, f"{where}{k}.")


def test_sgr_and_bootstrap_values_are_set_only_in_their_nodes():
    """No config (the companion configs aside: their own analyses) sets an SGR or resample value outside the
    sgr/bootstrap nodes; readers interpolate ``${sgr.*}``."""
    root = config_dir()
    flat = {"bootstrap_resamples", "appendix_resamples", "n_resamples", "n_boot", "selective"}
    for f in root.rglob("*.yaml"):
        rel = f.relative_to(root)
        if rel.parts[0] in ("companion", "sgr", "bootstrap"):
            continue
        for key, value in _keys(yaml.safe_load(f.read_text()) or {}):
            leaf = key.rsplit(".", 1)[-1]
            assert leaf not in flat or key.startswith("bootstrap."), f"{rel}: {key}"
            if leaf in ("alpha", "delta", "bound", "alphas", "match_coverage") and not key.startswith("sgr."):
                assert value == f"${{sgr.{leaf}}}", f"{rel}: {key} = {value!r}"


def test_free_form_maps_take_overrides():
    """The {detector: cap} maps and the evaluation's families stay open (any detector name is a key)."""
    fs = compose("faithshift", ["preset=quick", "max_steps_by_detector={sift: 245}"])
    assert dict(fs.max_steps_by_detector) == {"sift": 245}
    assert dict(fs.max_epochs_by_detector) == {"counterfactual": 40, "instance_level": 40}
    ev = compose("evaluate", ["paths.output_dir=/tmp/e", "families={a: gpt2}", "sgr.candidates=[0.5,0.75]"])
    assert dict(ev.families) == {"a": "gpt2"} and list(ev.sgr.candidates) == [0.5, 0.75]
