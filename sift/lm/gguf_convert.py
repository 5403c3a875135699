"""GGUF → safetensors model folder, one tensor at a time.

transformers reads a GGUF file by de-quantising every tensor into one float32 dict and then building the model
from it (``from_pretrained(gguf_file=...)``): two float32 copies of the model at once, 10.4 GB for a 1.5B model.
Here each tensor is de-quantised, renamed and written to a shard of at most ``shard_bytes`` before the next is
read, so the peak is about one shard plus one tensor. The names, the per-architecture tensor processing (e.g.
llama's rotary permutation undone) and the config come from transformers' own GGUF reader
(``transformers.modeling_gguf_pytorch_utils``), so the folder holds exactly the tensors transformers would build
(tested against it in tests/lm/test_gguf_convert.py; scripts/check_gguf_conversion.py compares a real model).
"""
from __future__ import annotations

import json
from pathlib import Path

#: largest shard written: the converter holds at most one shard of float32 tensors in memory
SHARD_BYTES = 512 * 1024 * 1024
INDEX = "model.safetensors.index.json"


def _meta_model(config):
    """The model of ``config`` on the meta device (no memory): only its parameter names are needed."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _dequantize(data, qtype, rows: int = 8192):
    """``gguf.dequantize`` of a tensor, ``rows`` rows at a time into one float32 array (the library's own
    intermediates for a whole 150k-row embedding are about its size again)."""
    import numpy as np
    from gguf import dequantize

    if data.ndim < 2 or data.shape[0] <= rows:
        return np.asarray(dequantize(data, qtype), dtype=np.float32)
    first = dequantize(data[:rows], qtype)
    out = np.empty((data.shape[0], *first.shape[1:]), dtype=np.float32)
    out[:rows] = first
    for i in range(rows, data.shape[0], rows):
        out[i:i + rows] = dequantize(data[i:i + rows], qtype)
    return out


def gguf_to_folder(path: Path, out: Path, shard_bytes: int = SHARD_BYTES, progress: bool = True) -> dict:
    """De-quantise the GGUF file at ``path`` into the model folder ``out`` (float32 safetensors shards with an
    index, config, generation config, tokenizer); returns ``{"tensors": n, "shards": k, "bytes": total}``."""
    import numpy as np
    import torch
    from gguf import GGUFReader
    from safetensors.torch import save_file
    from tqdm import tqdm
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        load_gguf_checkpoint,
        read_field,
    )

    kwargs = {"local_files_only": True, "gguf_file": path.name}
    tok = AutoTokenizer.from_pretrained(str(path.parent), **kwargs)
    config = AutoConfig.from_pretrained(str(path.parent), **kwargs)
    if hasattr(config, "quantization_config"):  # the folder holds plain float32 tensors
        del config.quantization_config
    config.dtype = torch.float32
    parsed = load_gguf_checkpoint(str(path), return_tensors=False)  # metadata only
    reader = GGUFReader(str(path))  # memory-mapped: a tensor's bytes are read when it is de-quantised
    arch = read_field(reader, "general.architecture")[0]
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=parsed["config"])
    meta = _meta_model(config)
    config.architectures = [type(meta).__name__]  # as save_pretrained writes it
    mapping = get_gguf_hf_weights_map(meta, processor)

    out.mkdir(parents=True, exist_ok=True)
    shard: dict[str, torch.Tensor] = {}
    names: list[list[str]] = []
    size = total = 0

    def flush() -> None:
        nonlocal shard, size
        if shard:
            save_file(shard, str(out / f".shard-{len(names):05d}"), metadata={"format": "pt"})
            names.append(list(shard))
            shard, size = {}, 0

    for t in tqdm(reader.tensors, desc=f"converting {path.name}", disable=not progress):
        res = processor.process(weights=_dequantize(t.data, t.tensor_type), name=t.name,
                                tensor_key_mapping=mapping, parsed_parameters=parsed)
        if res.name not in mapping:  # as transformers: a tensor the model has no parameter for is skipped
            continue
        w = np.ascontiguousarray(res.weights, dtype=np.float32)
        x = torch.from_numpy(w if w.flags.writeable else w.copy())  # a float32 tensor may be a view of the file
        if size and size + x.nbytes > shard_bytes:
            flush()
        shard[mapping[res.name]] = x
        size += x.nbytes
        total += x.nbytes
    flush()
    k = len(names)
    weight_map = {}
    for i, keys in enumerate(names):
        final = f"model-{i + 1:05d}-of-{k:05d}.safetensors"
        (out / f".shard-{i:05d}").rename(out / final)
        weight_map.update({key: final for key in keys})
    (out / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    config.save_pretrained(str(out))
    GenerationConfig.from_model_config(config).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return {"tensors": len(weight_map), "shards": k, "bytes": total}
