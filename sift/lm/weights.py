"""Load a safetensors model folder one tensor at a time, cast on the way in.

``from_pretrained(dtype=bfloat16)`` on a float32 folder holds the float32 tensors (memory-mapped pages count
toward RSS) next to the bfloat16 model: 4.3 GB peak for a 0.5B model whose bfloat16 weights are 1 GB. Here the
model is built empty in the target dtype and each tensor is read with plain file reads (no memory map) into one
float32 buffer and copied in, so the peak is the model plus its largest tensor. Used for a folder whose tensor
names are exactly the model's parameters (every GGUF conversion, most saved models); any other folder goes
through ``from_pretrained``.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

from sift.errors import PermanentError

#: safetensors dtype codes (the format's header) → torch dtype names
_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
           "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def safetensors_header(path: Path) -> tuple[dict, int]:
    """(header without ``__metadata__``, offset of the data section) of the safetensors file ``path``."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise PermanentError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (n,) = struct.unpack("<Q", raw)
        try:
            head = json.loads(f.read(n))
        except ValueError as e:
            raise PermanentError(f"{path}: unreadable safetensors header ({e})") from e
    head.pop("__metadata__", None)
    return head, 8 + n


def folder_tensor_names(folder: Path) -> dict[str, Path] | None:
    """Tensor name → safetensors file of a model folder; None without safetensors files."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    return {name: f for f in files for name in safetensors_header(f)[0]}


def read_tensors(path: Path) -> Iterator[tuple[str, object]]:
    """(name, tensor) for each tensor of ``path`` in file order, read into memory one at a time."""
    import torch

    head, start = safetensors_header(path)
    with open(path, "rb", buffering=0) as f:
        for name, spec in sorted(head.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            dtype = _DTYPES.get(spec["dtype"])
            if dtype is None:
                raise PermanentError(f"{path}: tensor {name}: unsupported safetensors dtype {spec['dtype']}")
            b, e = spec["data_offsets"]
            buf = torch.empty(e - b, dtype=torch.uint8)
            f.seek(start + b)
            if f.readinto(memoryview(buf.numpy())) != e - b:
                raise PermanentError(f"{path}: tensor {name}: file ends inside its data (truncated)")
            yield name, buf.view(getattr(torch, dtype)).reshape(spec["shape"])


def load_streaming(folder: Path, dtype: str | None):
    """The causal LM of ``folder`` in ``dtype`` (None: the config's), its tensors streamed in; None when the
    folder's tensor names are not exactly the model's state (the caller then uses ``from_pretrained``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers.initialization import no_init_weights

    names = folder_tensor_names(folder)
    if names is None:
        return None
    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    torch_dtype = getattr(torch, dtype) if dtype is not None else getattr(config, "dtype", None) or torch.float32
    if isinstance(torch_dtype, str):
        torch_dtype = getattr(torch, torch_dtype)
    with no_init_weights():  # the parameters are allocated, not initialised: every one is overwritten below
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    state = model.state_dict()
    tied = {k for k in state if k not in names} - {k for k in state if k.endswith(("inv_freq",))}
    if set(names) - set(state) or (tied and not (getattr(config, "tie_word_embeddings", False)
                                                  and tied <= {"lm_head.weight"})):
        return None
    for f in sorted(set(names.values())):
        for name, t in read_tensors(f):
            if state[name].shape != t.shape:
                raise PermanentError(f"{f}: tensor {name} has shape {tuple(t.shape)}, the model's is "
                                     f"{tuple(state[name].shape)}")
            with torch.no_grad():
                state[name].copy_(t)
    model.tie_weights()
    if (folder / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(str(folder))
    return model


def release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc ``malloc_trim``; a no-op elsewhere):
    a freed model's weights otherwise stay in the process's RSS, and the next model is counted on top."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass
