"""Load any Hugging Face causal LM by local path, cached hub name, or local GGUF file — never downloading.

sift never fetches weights at run time (docs/design.md §2): a hub name must already be in the local Hugging Face
cache; otherwise loading fails at once with one clear line instead of hanging on a network.
"""

from __future__ import annotations

import os
from pathlib import Path

from sift.errors import SiftError

GGUF_MAGIC = b"GGUF"


def is_gguf(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) == GGUF_MAGIC


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.endswith(".gguf") or os.sep in name and name.count("/") != 1


def load_causal_lm(name_or_path: str, *, device: str = "cpu", dtype: str | None = None):
    """(model, tokenizer) for a local folder, a local ``.gguf`` file or a hub name already in the cache."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict = {"local_files_only": True}
    if dtype is not None:
        kwargs["dtype"] = getattr(torch, dtype)
    path = Path(os.path.expanduser(name_or_path))
    if path.is_file():
        if not is_gguf(path):
            raise SiftError(f"{path}: not a GGUF file (expected the magic bytes 'GGUF'); "
                            "pass a model folder or a .gguf file")
        folder, fname = str(path.parent), path.name
        try:
            tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, **kwargs)
        except Exception as e:  # transformers raises many types for a bad GGUF
            raise SiftError(f"{path}: could not load GGUF model ({type(e).__name__}: {str(e).splitlines()[0]})") from e
    elif path.is_dir():
        if not (path / "config.json").exists():
            raise SiftError(f"{path}: no config.json; not a Hugging Face model folder")
        try:
            tok = AutoTokenizer.from_pretrained(str(path), **kwargs)
            model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
        except Exception as e:
            raise SiftError(f"{path}: could not load model ({type(e).__name__}: {str(e).splitlines()[0]})") from e
    elif _looks_like_path(name_or_path):
        raise SiftError(f"model path does not exist: {name_or_path}")
    else:
        try:
            tok = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
        except Exception as e:
            raise SiftError(
                f"model {name_or_path!r} is neither a local path nor in the local Hugging Face cache; sift never "
                f"downloads at run time — fetch it beforehand or pass a local folder or .gguf file") from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.to(device).eval()
    return model, tok
