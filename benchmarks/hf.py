"""transformers' twins of this repo's models: the same sizes and, for LLaMA, the same weights."""
from __future__ import annotations

from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig

from benchmarks.timing import Device
from interop.hf import hf_config, hf_state_dict
from model import ModelConfig, Transformer


def build_pair(cfg: ModelConfig, device: Device) -> tuple[Transformer, nn.Module]:
    """Our model and transformers' LlamaForCausalLM with the same config and the same weights."""
    ours = Transformer(cfg)
    theirs = AutoModelForCausalLM.from_config(LlamaConfig(**hf_config(cfg)), attn_implementation="sdpa")
    missing, unexpected = theirs.load_state_dict(hf_state_dict(ours), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # lm_head is tied
    return ours.to(device.name), theirs.to(device.name)


def hf_gpt2(cfg: ModelConfig) -> nn.Module:
    """transformers' GPT2LMHeadModel of cfg's sizes: LayerNorm, learned positions, MHA, exact GELU 4d, tied head
    (and, being GPT-2, biases in every linear layer and LayerNorm)."""
    from transformers import GPT2Config
    config = GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.context_length, n_embd=cfg.d_model,
                        n_layer=cfg.n_layers, n_head=cfg.n_heads, activation_function="gelu", resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=cfg.norm_eps, tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
