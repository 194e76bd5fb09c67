"""LLaMA: transformers' LlamaForCausalLM, llama.cpp's llama graph. This repo's model with the LLaMA choices
(RMSNorm, Pre-Norm, RoPE, SwiGLU, no biases; MHA, GQA or MQA) is one; base.py's answers are its.

Weights (i = layer, d = d_model, H / H_kv = query / K/V heads of D dims, F = d_ff, V = vocab):

    this repo                                  transformers
    tok_emb.weight            [V, d]           model.embed_tokens.weight
    blocks.i.attn_norm.weight [d]              model.layers.i.input_layernorm.weight
    blocks.i.attn.qkv.weight  [(H+2H_kv)D, d]  rows [Wq; Wk; Wv] = self_attn.{q,k,v}_proj.weight
    blocks.i.attn.out.weight  [d, H D]         model.layers.i.self_attn.o_proj.weight
    blocks.i.ffn_norm.weight  [d]              model.layers.i.post_attention_layernorm.weight
    blocks.i.ffn.w_in.weight  [2F, d]          rows [W1; W3] = mlp.gate_proj.weight, mlp.up_proj.weight
    blocks.i.ffn.w_out.weight [d, F]           model.layers.i.mlp.down_proj.weight
    final_norm.weight         [d]              model.norm.weight
    lm_head.weight            [V, d]           lm_head.weight (absent when tie_word_embeddings)

Both rotate q and k in the half-split layout (rotate_half), so no row permutation is needed. llama.cpp's llama graph
rotates adjacent pairs (2i, 2i + 1): gguf.py reorders attn_q's and attn_k's rows within each head (adjacent_rope).
"""
import gguf

from interop.families.base import Family, LlamaCppArch
from model.config import ModelConfig


class Llama(Family):
    name, model_type, class_name = "LLaMA", "llama", "LlamaForCausalLM"
    fixed = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}
    llama_cpp = LlamaCppArch(gguf.MODEL_ARCH.LLAMA, adjacent_rope=True)

    def claims(self, cfg: ModelConfig) -> bool:
        return True  # the most general: any model no other family claims is LLaMA's to export or refuse


FAMILY = Llama()
