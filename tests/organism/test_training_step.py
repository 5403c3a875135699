"""The organism's training step: length-sorted micro-batches give the same gradient as one padded batch."""

import random

import torch

from sift.organism.mixture import MixtureConfig, sample_example
from sift.organism.models import build_model
from sift.organism.tokenizer import build_tokenizer, organism_vocabulary
from sift.organism.train import accumulate_batch_loss, encode, length_sorted_chunks, weighted_lm_loss


def _setup(family: str):
    tok = build_tokenizer(organism_vocabulary())
    torch.manual_seed(0)
    model = build_model(family, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, width=32, layers=2,
                        heads=2)
    rng = random.Random(3)
    return tok, model, [sample_example(rng, MixtureConfig()) for _ in range(12)]


def test_chunks_are_length_sorted_and_cover_the_batch():
    _, _, ex = _setup("gpt2")
    chunks = length_sorted_chunks(ex, 4)
    lengths = [len(e.prompt) + len(e.completion) for c in chunks for e in c]
    assert lengths == sorted(lengths) and sum(map(len, chunks)) == 12 and len(chunks) == 4


def test_micro_batch_gradient_equals_full_batch_gradient():
    for family in ("gpt2", "llama"):
        tok, model, ex = _setup(family)
        model.zero_grad()
        full = weighted_lm_loss(model, encode(ex, tok, 3.0))
        full.backward()
        g_full = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        loss = accumulate_batch_loss(model, ex, tok, 3.0, micro_batches=4)
        assert abs(loss - full.item()) < 1e-5
        for g, p in zip(g_full, model.parameters()):
            torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)
