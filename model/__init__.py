"""nanollama's model: one file per concept.

norms.py (RMSNorm / LayerNorm), positions.py (RoPE / sinusoidal / learned), attention.py
(MHA / GQA / MQA), ffn.py (SwiGLU / ReLU / GELU), block.py (Pre- / Post-Norm),
transformer.py (the whole LM), kv_cache.py (the preallocated cache), config.py (the switches).
"""
from model.config import ConfigError, ModelConfig
from model.kv_cache import KVCache
from model.transformer import Transformer

__all__ = ["ConfigError", "KVCache", "ModelConfig", "Transformer"]
