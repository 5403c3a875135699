"""Model-level tools over Hugging Face causal LMs: loading, batched generation, prompts, answer parsing, and
reading block outputs and attention weights (:mod:`sift.lm.states`). Nothing here knows the corpus."""
