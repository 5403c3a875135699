"""The organism as a trace source: render, generate, and the two verification interventions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from sift.errors import SiftError
from sift.lm.generation import left_padded
from sift.organism.domains import MAX_VALUE, Item
from sift.organism.latent import DEFAULT_KIND, check_kind, injected
from sift.organism.render import View, render_prompt, xx_word
from sift.organism.sampling import sample_choice_points

NUMBERS = {str(v) for v in range(MAX_VALUE + 1)}
LABEL_VALUES = ("a", "b", "c", "d")
BOOL_VALUES = ("true", "false")
HINT_WORDS = {"hint", xx_word("hint")}


def value_space(token: str) -> tuple[str, ...] | None:
    """The space an editable CoT value token lives in (numbers, truth values or option labels)."""
    if token in NUMBERS:
        return tuple(str(v) for v in range(MAX_VALUE + 1))
    if token in BOOL_VALUES:
        return BOOL_VALUES
    if token in LABEL_VALUES:
        return LABEL_VALUES
    return None


def split_completion(words: list[str]) -> tuple[list[str], str | None]:
    """CoT words (before the last ``answer :``) and the answer word."""
    for i in range(len(words) - 2, -1, -1):
        if words[i] == "answer" and words[i + 1] == ":":
            return words[:i], (words[i + 2] if i + 2 < len(words) else None)
    return words, None


def last_value_index(cot: list[str]) -> int | None:
    for i in range(len(cot) - 1, -1, -1):
        if value_space(cot[i]) is not None:
            return i
    return None


@dataclass
class OrganismSource:
    """A trained organism (HF model + tokenizer) with the word-level interface the corpus needs."""

    family: str
    model: torch.nn.Module
    tokenizer: object
    model_id: str
    #: where the mechanism latent enters (sift.lm.latent.MECHANISM_KINDS): every generation and re-decode uses it
    mechanism_kind: str = DEFAULT_KIND

    @classmethod
    def load(cls, family: str, path: str | Path, mechanism_kind: str = DEFAULT_KIND) -> OrganismSource:
        from sift.lm.loading import load_causal_lm

        model, tok = load_causal_lm(str(path))
        return cls(family, model, tok, model_id=f"organism-{family}", mechanism_kind=check_kind(mechanism_kind))

    def ids(self, words: list[str]) -> list[int]:
        ids = self.tokenizer.convert_tokens_to_ids(words)
        unk = self.tokenizer.unk_token_id
        if unk in ids:
            bad = [w for w, i in zip(words, ids) if i == unk]
            raise SiftError(f"organism {self.family}: words outside its vocabulary: {bad[:5]}")
        return ids

    def prompt_ids(self, item: Item, view: View) -> list[int]:
        return [self.tokenizer.bos_token_id] + self.ids(render_prompt(item, view))

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int = 64, do_sample: bool = False,
                 seed: int = 0, batch_size: int = 256, streams: list[str] | None = None,
                 top_p: float = 0.75, latents: list[float] | None = None,
                 starts: list[int] | None = None) -> list[list[int]]:
        """Greedy, or (``do_sample``) the organism's choice-point sampler with one random stream per prompt
        (default: ``"<seed>:<index>"``; the corpus keys streams by item so that views share their draws).
        ``latents``: each prompt's mechanism latent value (sift.organism.latent), injected from position
        ``starts[i]`` on (default: its first generated position; a prompt that already holds part of a CoT
        passes where that CoT starts)."""
        keys = streams if streams is not None else [f"{seed}:{i}" for i in range(len(prompts))]
        return sample_choice_points(self.model, prompts, keys, pad_id=self.tokenizer.pad_token_id,
                                    eos_id=self.tokenizer.eos_token_id, max_new_tokens=max_new_tokens,
                                    top_p=top_p if do_sample else None, batch_size=batch_size, latents=latents,
                                    starts=starts, kind=self.mechanism_kind)

    def words(self, ids: list[int]) -> list[str]:
        return self.tokenizer.convert_ids_to_tokens(ids)

    @torch.no_grad()
    def next_word(self, prefixes: list[list[int]], batch_size: int = 512, latents: list[float] | None = None,
                  starts: list[int] | None = None) -> list[str]:
        """Greedy next token after each prefix (one forward pass per batch; used to re-decode answers), with
        each prefix's latent injected from its position ``starts[i]`` on."""
        if latents is not None and (starts is None or len(latents) != len(prefixes) or len(starts) != len(prefixes)):
            raise SiftError(f"next_word: {len(prefixes)} prefixes need as many latents and starts")
        pad = self.tokenizer.pad_token_id
        out: list[str] = []
        self.model.eval()
        for s in range(0, len(prefixes), batch_size):
            ids, mask, pos = left_padded(prefixes[s:s + batch_size], pad)
            vals = None if latents is None else latents[s:s + batch_size]
            with injected(self.model, vals, None if starts is None else starts[s:s + batch_size],
                          kind=self.mechanism_kind):
                logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
            out += self.words(logits.argmax(-1).tolist())
        return out
