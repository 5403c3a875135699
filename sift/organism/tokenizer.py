"""The organism's tokenizer: a real Hugging Face fast tokenizer (word level) over a closed vocabulary."""

from __future__ import annotations

import random
from pathlib import Path

from sift.organism.domains import MAX_VALUE

SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"]


def organism_vocabulary(n_samples: int = 20000, seed: int = 0) -> list[str]:
    """Every word the renderer can emit (found by exhaustive sampling of the mixture; checked in tests)."""
    from sift.organism.mixture import MixtureConfig, sample_example

    rng = random.Random(seed)
    words: set[str] = {str(v) for v in range(MAX_VALUE + 2)}
    cfg = MixtureConfig(p_cue=0.8, p_explain=0.3)
    for _ in range(n_samples):
        ex = sample_example(rng, cfg)
        words.update(ex.prompt)
        words.update(ex.completion)
    return SPECIAL + sorted(words)


def build_tokenizer(vocab: list[str]):
    """A ``PreTrainedTokenizerFast`` (WordLevel model, whitespace pre-tokenizer) for ``vocab``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins word-level tokens with spaces
    bos = vocab.index("<bos>")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>", padding_side="left", model_max_length=128)


def save_tokenizer(tokenizer, path: str | Path) -> None:
    tokenizer.save_pretrained(str(path))
