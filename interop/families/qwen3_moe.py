"""Qwen3-MoE: Qwen3MoeForCausalLM, Qwen3 whose FFNs are experts under the softmax router, the first ones dense where
mlp_only_layers says so (model.dense_layers), with one sliding window in every layer or none. Its experts are
Mixtral's (mixtral.py) under mlp. with gate_proj, up_proj, down_proj; config.json calls E num_experts and d_e
moe_intermediate_size.

llama.cpp runs it as its qwen3moe graph: qwen3's with experts in every block (no dense ones), the head dim written
out as key_length / value_length (which transformers' GGUF loader reads there).
"""
import gguf

from interop import InteropError
from interop.families.base import MOE_SWITCHES, Family, LlamaCppArch
from interop.families.qwen3 import Qwen3
from interop.layout import GATED_PROJECTIONS, Experts
from model.config import ModelConfig


class Qwen3Moe(Qwen3):
    name, model_type, class_name = "Qwen3-MoE", "qwen3_moe", "Qwen3MoeForCausalLM"
    switches = MOE_SWITCHES | {"qk_norm": "rmsnorm"}
    fixed = {"hidden_act": "silu", "attention_bias": False, "norm_topk_prob": True, "decoder_sparse_step": 1}
    experts = Experts("mlp", *GATED_PROJECTIONS)
    n_experts_key, expert_width_key = "num_experts", "moe_intermediate_size"
    every_layer_window = True
    llama_cpp = LlamaCppArch(gguf.MODEL_ARCH.QWEN3MOE, adjacent_rope=False)

    def claims(self, cfg: ModelConfig) -> bool:
        return cfg.ffn == "moe" and cfg.router == "softmax" and cfg.qk_norm == "rmsnorm"

    def expert_keys(self, cfg: ModelConfig) -> dict:
        return super().expert_keys(cfg) | {"mlp_only_layers": list(range(cfg.dense_layers))}

    def window_keys(self, cfg: ModelConfig) -> dict:
        return {"use_sliding_window": cfg.window is not None, "sliding_window": cfg.window}

    def expert_settings(self, hf: dict) -> dict:
        values = super().expert_settings(hf)
        dense = hf.get("mlp_only_layers") or []
        if dense != list(range(len(dense))):  # this repo's dense blocks are the first ones (model.dense_layers)
            raise InteropError(f"mlp_only_layers={dense} is not supported; this repo's dense blocks are the first "
                               f"model.dense_layers ones, e.g. mlp_only_layers={list(range(len(dense)))}")
        return values | {"dense_layers": len(dense)}

    default_layer_types = Family.default_layer_types  # a window in every layer, not Qwen3's from max_window_layers

    def check_llama_cpp(self, cfg: ModelConfig) -> None:
        if cfg.dense_layers:
            raise InteropError(f"model.dense_layers={cfg.dense_layers} has no llama.cpp qwen3moe equivalent: its "
                               f"graph has experts in every block")
        super().check_llama_cpp(cfg)

    def add_llama_cpp_ffn(self, writer: gguf.GGUFWriter, cfg: ModelConfig) -> None:
        writer.add_feed_forward_length(cfg.ffn_width)
        writer.add_expert_count(cfg.n_experts)
        writer.add_expert_used_count(cfg.experts_per_token)
        writer.add_expert_feed_forward_length(cfg.expert_width)

    def add_llama_cpp_attention(self, writer: gguf.GGUFWriter, cfg: ModelConfig) -> None:
        super().add_llama_cpp_attention(writer, cfg)
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)


FAMILY = Qwen3Moe()
