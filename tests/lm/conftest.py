"""Session fixtures for the real-LM tests (helpers live in tinylm.py)."""

from __future__ import annotations

import pytest
from tinylm import make_model, make_tokenizer


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """{"gpt2": folder, "llama": folder}; the Llama tokenizer has a chat template, the GPT-2 one has none."""
    root = tmp_path_factory.mktemp("tiny_lms")
    out = {}
    for arch, chat in (("gpt2", False), ("llama", True)):
        tok = make_tokenizer(chat)
        model = make_model(arch, tok)
        d = root / arch
        model.save_pretrained(d)
        tok.save_pretrained(d)
        out[arch] = d
    return out
