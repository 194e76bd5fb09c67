"""nanollama's model: the architecture, one file per concept.

interfaces.py (what each family of kinds answers), config.py (the switches and sizes), norms.py (RMSNorm /
LayerNorm), positions.py (RoPE / sinusoidal / learned), rope_scaling.py (RoPE past the trained context), attention.py
(MHA / GQA / MQA), mla.py (multi-head latent attention), gated_deltanet.py (a linear layer with a fixed-size state),
qk_norm.py (QK-norm), ffn.py (SwiGLU / ReLU / GELU / ReLU²), moe.py (mixture of experts), block.py (Pre- /
Post-Norm), transformer.py (the whole LM), kv_cache.py (the preallocated cache). Generation, checkpoints and
transformers interop use it from outside: generation/, storage/, interop/.
"""
from model.config import ModelConfig
from model.kv_cache import KVCache
from model.transformer import Transformer

__all__ = ["ModelConfig", "KVCache", "Transformer"]
