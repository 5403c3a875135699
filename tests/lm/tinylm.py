"""Helpers for the real-LM tests: an in-memory BPE tokenizer, tiny random GPT-2 / Llama models, a tiny GGUF."""

from __future__ import annotations

import json

from sift.lm.prompts import ALL_CUE_FORMATS, BUDGETS, INSTRUCTION, KIND_INSTRUCTIONS, TEMPLATES, VERBALIZE, render_cue

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SPECIALS = ["<|endoftext|>", "<|user|>", "<|system|>", "<|assistant|>"]


def _corpus() -> list[str]:
    texts = [INSTRUCTION, VERBALIZE, *KIND_INSTRUCTIONS.values(), *BUDGETS.values(), *TEMPLATES,
             *(render_cue(v, f) for f in ALL_CUE_FORMATS for v in ("12", "B", "True"))]
    texts += ["Answer: 42", "Step 1: 3 + 4 = 7\nStep 2: 7 * 2 = 14\nAnswer: 14", "Calculate 5 - 3 - 6.",
              "Tom has 3 apples and gets 4 more. How many apples does he have?", "Options:\n(A) red\n(B) blue",
              "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 - + * / = . , ? ( )"]
    return texts * 3


def make_tokenizer(chat: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def make_model(arch: str, tok, seed: int = 0):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    ids = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id)
    if arch == "gpt2":
        cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=1024, initializer_range=0.2, **ids)
        return GPT2LMHeadModel(cfg).eval()
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.2,
                      tie_word_embeddings=False, **ids)
    return LlamaForCausalLM(cfg).eval()


def write_tiny_llama_gguf(path, model, tok, quantize: bool = False) -> None:
    """A float32 llama GGUF with a byte-level BPE (``gpt2``) vocabulary, as llama.cpp's converter lays it out;
    ``quantize``: its matrices in Q8_0 (blocks of 32 along a row), the norms float32, as a quantised file has."""
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(7 if quantize else 0)  # 7 = mostly Q8_0, 0 = all float32
    spec = json.loads(tok.backend_tokenizer.to_str())
    tokens = [""] * len(tok)
    for t, i in spec["model"]["vocab"].items():
        tokens[i] = t
    for a in spec["added_tokens"]:
        tokens[a["id"]] = a["content"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]])
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])  # 3 = control, 1 = normal
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_chat_template(tok.chat_template)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    add = w.add_tensor

    def add_tensor(name, x):
        if quantize and x.ndim == 2:
            q = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
            return add(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        return add(name, x)

    w.add_tensor = add_tensor

    def permute(x, n_head):  # llama.cpp's rotary layout for q/k (transformers undoes it on load)
        return x.reshape(n_head, 2, x.shape[0] // n_head // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)

    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(f"blk.{i}.attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], cfg.num_attention_heads))
        w.add_tensor(f"blk.{i}.attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], cfg.num_key_value_heads))
        w.add_tensor(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.add_tensor(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
