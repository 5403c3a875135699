"""The organism tokenizer is a real HF fast tokenizer that covers every word the renderer emits."""

import random

from sift.organism.mixture import MixtureConfig, sample_example
from sift.organism.tokenizer import build_tokenizer, organism_vocabulary


def test_vocabulary_covers_renderer_and_roundtrips():
    vocab = organism_vocabulary(n_samples=3000)
    tok = build_tokenizer(vocab)
    rng = random.Random(7)
    for _ in range(500):
        ex = sample_example(rng, MixtureConfig(p_cue=0.9, p_explain=0.5))
        words = ex.prompt + ex.completion
        ids = tok.convert_tokens_to_ids(words)
        assert tok.unk_token_id not in ids, [w for w, i in zip(words, ids) if i == tok.unk_token_id]
        text = " ".join(words)
        enc = tok(text)["input_ids"]
        assert enc[0] == tok.bos_token_id and enc[1:] == ids
        assert tok.decode(enc, skip_special_tokens=True) == text
