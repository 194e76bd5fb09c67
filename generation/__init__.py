"""Generating text with a model: engine.py (prefill, sample, forward one token with the KV cache; sampling
rules; compiled_decoder) and kv_memory.py (`python -m generation.kv_memory`: the KV cache's bytes for any
model)."""
