"""Qwen2: Qwen2ForCausalLM, Qwen3 without QK-norm and with biases on the q, k and v projections. This repo's
projections have biases all or none (model.bias), so it neither exports nor imports Qwen2; it reads a Qwen2
config.json's head dim and windows, as Qwen3's (the KV-cache estimator, generation/kv_memory.py)."""
from interop.families.qwen3 import Qwen3
from model.config import ModelConfig


class Qwen2(Qwen3):
    name, model_type, class_name = "Qwen2", "qwen2", "Qwen2ForCausalLM"
    default_head_dim = None  # Qwen2Config has no head_dim: hidden_size / num_attention_heads
    refusal = ("its q, k and v projections have biases and its output and MLP projections none, where this repo's "
               "projections have biases all or none (model.bias)")

    def claims(self, cfg: ModelConfig) -> bool:
        return False


FAMILY = Qwen2()
