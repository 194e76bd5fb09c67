"""nanollama's model: one file per concept.

norms.py (RMSNorm / LayerNorm), positions.py (RoPE / sinusoidal / learned), attention.py
(MHA / GQA / MQA), ffn.py (SwiGLU / ReLU / GELU), block.py (Pre- / Post-Norm),
transformer.py (the whole LM), kv_cache.py (the preallocated cache and its memory estimator),
config.py (the switches), checkpoint.py (save / load), engine.py (generation), hf_interop.py
(transformers' LLaMA).
"""
import importlib

_EXPORTS = {"ConfigError": "model.config", "ModelConfig": "model.config", "KVCache": "model.kv_cache",
            "Transformer": "model.transformer"}
__all__ = list(_EXPORTS)


def __getattr__(name):
    # Lazy, so `python -m model.kv_cache` runs the module fresh instead of after an eager import.
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'model' has no attribute {name!r}")
