"""The trajectory stage of sift-faithshift reads hidden states in the dtype the real-LM corpus was generated in."""

import pytest

import sift.trajectories.job as job
from sift.config import compose
from sift.faithshift import extract


@pytest.mark.parametrize("extra,expected", [([], "bfloat16"), (["extract_overrides=['dtype=float32']"], "float32")])
def test_extraction_takes_the_source_dtype_unless_overridden(tiny_dirs, tmp_path, monkeypatch, extra, expected):
    seen = {}
    monkeypatch.setattr(job, "run_extract", lambda c: seen.update(dtype=c.dtype, models=dict(c.models)))
    cfg = compose("faithshift", [f"paths.output_dir={tmp_path}", "source=hf", f"source.models=[{tiny_dirs['gpt2']}]",
                                 "source.dtype=bfloat16", *extra])
    extract(cfg, tmp_path)
    assert seen["dtype"] == expected and list(seen["models"].values()) == [str(tiny_dirs["gpt2"])]


def test_the_organism_source_keeps_the_extract_default(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(job, "run_extract", lambda c: seen.update(dtype=c.dtype))
    extract(compose("faithshift", [f"paths.output_dir={tmp_path}"]), tmp_path)
    assert seen["dtype"] is None
