"""The two organism architectures: GPT-2-style and Llama-style configs of about 0.8 M parameters."""

from __future__ import annotations

FAMILIES = ("gpt2", "llama")


def build_model(family: str, vocab_size: int, pad_id: int, bos_id: int, eos_id: int,
                width: int = 128, layers: int = 4, heads: int = 4, max_positions: int = 128):
    """A freshly initialised HF causal LM of ``family`` (initialised from the current torch seed)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from sift.errors import SiftError

    common = dict(vocab_size=vocab_size, pad_token_id=pad_id, bos_token_id=bos_id, eos_token_id=eos_id)
    if family == "gpt2":
        cfg = GPT2Config(n_embd=width, n_layer=layers, n_head=heads, n_positions=max_positions,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
        return GPT2LMHeadModel(cfg)
    if family == "llama":
        cfg = LlamaConfig(hidden_size=width, intermediate_size=int(width * 2.75) // 8 * 8, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=heads,
                          max_position_embeddings=max_positions, tie_word_embeddings=True, **common)
        return LlamaForCausalLM(cfg)
    raise SiftError(f"unknown organism family {family!r}; expected one of {', '.join(FAMILIES)}")
