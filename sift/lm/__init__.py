"""One interface over Hugging Face causal LMs: loading, batched generation, answer parsing."""
