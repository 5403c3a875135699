"""The streaming GGUF conversion (sift.lm.gguf_convert) and the streaming loader (sift.lm.weights) give exactly
what transformers' own GGUF reader and from_pretrained give."""

import json

import pytest
import torch
from tinylm import make_model, make_tokenizer, write_tiny_llama_gguf

from sift.lm.gguf_convert import INDEX, gguf_to_folder
from sift.lm.weights import load_streaming, read_tensors


@pytest.fixture(scope="module", params=[False, True], ids=["f32", "q8_0"])
def tiny_gguf(request, tmp_path_factory):
    tok = make_tokenizer(chat=True)
    path = tmp_path_factory.mktemp("gguf") / "Tiny-Llama.gguf"
    write_tiny_llama_gguf(path, make_model("llama", tok, seed=1), tok, quantize=request.param)
    return path


def _state(folder):
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(dict(read_tensors(f)))
    return out


def test_streamed_conversion_has_transformers_tensors_and_config(tiny_gguf, tmp_path):
    pytest.importorskip("accelerate")  # transformers loads GGUF files only with accelerate installed
    from transformers import AutoModelForCausalLM

    info = gguf_to_folder(tiny_gguf, tmp_path / "out", shard_bytes=20_000, progress=False)
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name,
                                               dtype=torch.float32, local_files_only=True)
    got = _state(tmp_path / "out")
    want = ref.state_dict()
    assert set(got) == set(want) and info["tensors"] == len(want) and info["shards"] > 2
    for k, v in want.items():
        assert got[k].dtype == torch.float32 and torch.equal(got[k], v), k  # bit for bit, q/k un-permuted
    index = json.loads((tmp_path / "out" / INDEX).read_text())
    assert set(index["weight_map"]) == set(want)
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in want.values())
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in cfg


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_streaming_load_equals_from_pretrained(tiny_gguf, tmp_path, dtype):
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "out"
    gguf_to_folder(tiny_gguf, folder, progress=False)
    a = load_streaming(folder, dtype)
    b = AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, dtype), local_files_only=True)
    assert a is not None and next(a.parameters()).dtype == getattr(torch, dtype)
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb) and all(torch.equal(sa[k], sb[k]) for k in sb)
    ids = torch.tensor([[1, 5, 9, 13, 2, 7]])
    with torch.no_grad():
        assert torch.equal(a.eval()(ids).logits, b.eval()(ids).logits)


def test_a_folder_whose_names_are_not_the_models_is_left_to_from_pretrained(tiny_gguf, tmp_path):
    from safetensors.torch import save_file

    folder = tmp_path / "out"
    gguf_to_folder(tiny_gguf, folder, progress=False)
    save_file({"some.other.weight": torch.zeros(2)}, str(folder / "extra.safetensors"))
    assert load_streaming(folder, "float32") is None


def test_a_truncated_shard_is_named(tiny_gguf, tmp_path):
    from sift.errors import PermanentError

    folder = tmp_path / "out"
    gguf_to_folder(tiny_gguf, folder, progress=False)
    f = sorted(folder.glob("*.safetensors"))[-1]
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(PermanentError, match=rf"{f.name}: tensor .*: file ends inside its data \(truncated\)"):
        load_streaming(folder, "float32")
