"""Add an appendix analysis: one registered AppendixAnalysis in a module named in ``report.section_modules``;
the main job's appendix runs it, with its own variants, in the parent and in spawned workers alike."""

from __future__ import annotations

import sys
import textwrap

import ev_toy as toy
import pytest
from omegaconf import OmegaConf

from sift.evaluation import appendix
from sift.report.analysis import Registry

MODULE = textwrap.dedent('''
    from sift.evaluation.appendix import AppendixAnalysis, register_analysis
    from sift.report import Section


    def seed_count(runs, pairs, *, scale=1, out_dir=None, n_resamples=0, seed=0, table=None):
        n = {name: scale * len(stack) for name, stack in sorted(runs.items())}
        return Section("appendix_seed_count", "Seeds per detector", f"{n}",
                       results={"seeds": n, "n_pairs": len(pairs.axis), "n_resamples": n_resamples})


    register_analysis(AppendixAnalysis(
        "seed_count", seed_count, ("runs", "pairs"), ("out_dir",), "not in the paper",
        jobs=lambda cfg, sel: [(None, {}), ("double", {"scale": 2})]))
''')


@pytest.mark.parametrize("workers", [1, 2])
def test_a_registered_analysis_runs_in_the_main_jobs_appendix(tmp_path, monkeypatch, workers):
    from sift.errors import SiftError
    from sift.evaluation.faithshift_report import appendix_jobs, appendix_sections

    mod = f"sift_test_seed_count_{workers}"
    (tmp_path / f"{mod}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned workers start with the parent's sys.path
    # only the new analysis in this process
    monkeypatch.setattr(appendix, "APPENDIX_ANALYSES", Registry("appendix analysis"))
    try:
        cfg = OmegaConf.create({"workers": workers, "bootstrap": {"appendix_resamples": 7, "seed": 0},
                                "sgr": {"alpha": 0.25, "delta": 0.05}, "detectors": ["sift"],
                                "report": {"section_modules": [mod]}})
        jobs = appendix_jobs(cfg)
        assert jobs == {"seed_count": ("seed_count", {}, None),
                        "seed_count_double": ("seed_count", {"scale": 2}, "appendix_seed_count_double")}
        runs = {"a": [toy.predictions(0, detector="a"), toy.predictions(1, detector="a")],
                "b": [toy.predictions(0, detector="b")]}
        secs = appendix_sections(cfg, {"runs": runs, "pairs": toy.pairs()})
        assert [s.key for s in secs] == ["appendix_seed_count", "appendix_seed_count_double"]
        assert secs[0].results["seeds"] == {"a": 2, "b": 1} and secs[1].results["seeds"] == {"a": 4, "b": 2}
        assert secs[0].results["n_resamples"] == 7  # the job's appendix resamples reach every analysis
        assert secs[0].results["n_pairs"] == len(toy.pairs().axis)
        first = appendix.APPENDIX_ANALYSES["seed_count"]
        appendix.register_analysis(first)  # the same definition again (a module imported twice): kept
        with pytest.raises(SiftError, match="registered twice"):  # another definition under its name
            appendix.register_analysis(appendix.AppendixAnalysis("seed_count", len, ("runs",), (), "nowhere"))
    finally:
        sys.modules.pop(mod, None)
