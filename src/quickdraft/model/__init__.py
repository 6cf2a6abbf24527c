"""The native decoder runtime: configuration, transformer, KV cache, weights, tokenizer."""
